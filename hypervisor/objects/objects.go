// Package objects is a session's GPU objects: its modules (and the images
// they came from), its functions and their declared parameters, its
// streams and the first error of each stream's asynchronous work, and
// the handlers of the requests that make and use them (module loads by
// image, by hash or uploaded in pieces, module variables, kernel launches, stream and device
// synchronisation).
//
// It owns the session's handle table (package handlemap) and every check
// a launch gets before a GPU runs it: its function, its dimensions, its
// arguments' kinds and sizes, and that every pointer argument and the
// whole footprint of a library kernel lie inside the session's own
// allocations. It must never reach device memory that Memory does not
// vouch for, never load a kernel that is not the library's own unless the
// node runs one guest per process, and never decide what is logged: the
// session does.
//
// A Set is not safe for concurrent use: its session's lock serialises it.
package objects

import (
	"encoding/binary"
	"fmt"

	"github.com/vgpuha/vgpuha/handlemap"
	"github.com/vgpuha/vgpuha/hypervisor/gpu"
	"github.com/vgpuha/vgpuha/hypervisor/images"
	"github.com/vgpuha/vgpuha/hypervisor/internal/guesterr"
	"github.com/vgpuha/vgpuha/kernels"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
	"github.com/vgpuha/vgpuha/replicate"
	"github.com/vgpuha/vgpuha/replicate/verify"
)

// Memory is the session's device memory as its objects see it: the
// allocations a launch's pointers must lie in.
type Memory interface {
	// CheckRange refuses [addr, addr+n) unless it lies inside one of the
	// session's allocations (the error names what, for the guest).
	CheckRange(addr, n uint64, what string) error
	// Contains reports the same without the error (a launch checks every
	// argument; the message only for a refusal).
	Contains(addr, n uint64) bool
	// Delta is added to a guest address to get the backend's: zero where
	// the window lies where the guest sees it, else addresses are
	// translated (a standby whose backend refused the primary's base).
	Delta() uint64
	// Allocations counts the session's allocations (objects quota).
	Allocations() int
}

// Config is what a session's objects are allowed and given.
type Config struct {
	// Backend is described (device info, limits, whether it checks every
	// access), never driven: the context is.
	Backend gpu.Backend
	// GuestKernels lets the guest load kernels that are not the library's
	// own (one guest per process).
	GuestKernels bool
	// MaxObjects bounds the session's allocations plus handles.
	MaxObjects int
	// Images is the node's image stores; Tenant the session's tenant,
	// which a load by hash must have sent the image itself.
	Images *images.Cache
	Tenant string
	// ImageBytes counts image bytes loaded, by where they came from
	// ("guest", "cache").
	ImageBytes func(from string, n int64)
}

// Set is one session's objects.
type Set struct {
	cfg          Config
	ctx          gpu.Context
	mem          Memory
	handles      *handlemap.Table
	kernels      map[handlemap.Handle]abi.KernelSpec // function handle -> declaration
	deferred     map[handlemap.Handle]error          // first error of async work per stream (0: null stream)
	moduleImages map[handlemap.Handle]*abi.ModuleImage
	// uploads are the images the guest is uploading in pieces.
	uploads *images.Uploads
	// footprint is checkFootprint's buffer, reused from launch to launch.
	footprint []kernels.Extent
	// replaying: a replicated record is being applied; a load by hash
	// takes the image the log carried, and no load is cached.
	replaying bool
	// log, when set, is the primary's replication log, which must carry
	// an image before a load by hash of it is logged; session is this
	// session's id in it.
	log     *replicate.Log
	session uint64
	// globals are the module variables whose addresses the guest holds
	// (globalmap.go); tensorMaps the maps over them (tensormaps.go).
	globals    globalMap
	tensorMaps tensorMaps
}

// New returns the objects of a session running on ctx, whose memory is mem.
func New(ctx gpu.Context, mem Memory, cfg Config) *Set {
	return &Set{
		cfg: cfg, ctx: ctx, mem: mem,
		handles:      handlemap.NewTable(),
		kernels:      map[handlemap.Handle]abi.KernelSpec{},
		moduleImages: map[handlemap.Handle]*abi.ModuleImage{},
		deferred:     map[handlemap.Handle]error{},
		uploads:      cfg.Images.Uploads(cfg.Tenant),
	}
}

// Replaying says whether a replicated record is being applied.
func (o *Set) Replaying(on bool) { o.replaying = on }

// Replicate sets the log that carries images (nil: not replicating) and
// the session's id in it.
func (o *Set) Replicate(log *replicate.Log, session uint64) { o.log, o.session = log, session }

// Len counts the handles held.
func (o *Set) Len() int { return o.handles.Len() }

// Next is the handle the next object will get; SetNext makes it h (a
// resync placing an object where the primary had it).
func (o *Set) Next() handlemap.Handle           { return o.handles.Next() }
func (o *Set) SetNext(h handlemap.Handle) error { return o.handles.SetNext(h) }

// Reset drops every handle and upload (the session is closed; its context
// with it).
func (o *Set) Reset() {
	o.handles = handlemap.NewTable()
	o.uploads.Free()
}

// CheckRoom refuses a new object once the session holds its quota of
// allocations and handles.
func (o *Set) CheckRoom() error {
	if n := o.handles.Len() + o.mem.Allocations(); n >= o.cfg.MaxObjects {
		return guesterr.Fail(abi.StatusOutOfMemory, "session holds %d objects, quota %d", n, o.cfg.MaxObjects)
	}
	return nil
}

// Sums describes every object of session for verify: a module by its
// image, a function by its module and name, a stream by its handle.
func (o *Set) Sums(session uint64) []verify.ObjectSum {
	var sums []verify.ObjectSum
	o.handles.Each(func(h handlemap.Handle, k handlemap.Kind, _ uint64, parent handlemap.Handle) {
		s := verify.ObjectSum{Session: session, ID: uint64(h)}
		switch k {
		case handlemap.KindModule:
			img, sum := o.moduleImages[h], verify.Checksummer{}
			img.Pieces(1<<20, func(_ int, p []byte) { sum.Write(p) }) // an image may be large: no copy of it whole
			s.Kind, s.Size, s.Sum = verify.ObjModule, uint64(img.EncodedSize()), sum.Sum()
		case handlemap.KindFunction:
			s.Kind, s.Sum = verify.ObjFunction, verify.Checksum(fmt.Appendf(nil, "%d/%s", parent, o.kernels[h].Name))
		case handlemap.KindStream:
			s.Kind = verify.ObjStream
		}
		sums = append(sums, s)
	})
	o.uploads.Each(func(h abi.ImageHash, _ uint64, held []byte) {
		sums = append(sums, verify.ObjectSum{Session: session, Kind: verify.ObjUpload, ID: binary.LittleEndian.Uint64(h[:]),
			Size: uint64(len(held)), Sum: verify.Checksum(held)})
	})
	return sums
}

// Records returns the records that recreate every object of session
// under the handle it has (a resync snapshot), each made by place: a
// module whose image is too large for one request as the pieces of an
// upload and a load by hash, and every upload in progress as its pieces
// so far (a guest that resumes on the new standby carries on with it).
func (o *Set) Records(place func(op abi.Opcode, body abi.Body, result uint64) replicate.Record) []replicate.Record {
	var recs []replicate.Record
	stage := func(p *abi.ImageStage) { recs = append(recs, place(abi.OpImageStage, p, 0)) }
	o.handles.Each(func(h handlemap.Handle, k handlemap.Kind, _ uint64, parent handlemap.Handle) {
		switch k {
		case handlemap.KindModule:
			img := o.moduleImages[h]
			if img.EncodedSize() <= abi.MaxModuleImage {
				recs = append(recs, place(abi.OpModuleLoad, &abi.ModuleLoad{Image: img.Append(nil)}, uint64(h)))
				break
			}
			hash := img.Hash()
			images.EachPiece(hash, img, stage)
			recs = append(recs, place(abi.OpModuleLoadCached, &abi.ModuleLoadCached{Hash: hash}, uint64(h)))
		case handlemap.KindFunction:
			recs = append(recs, place(abi.OpGetFunction, &abi.GetFunction{Module: uint64(parent), Name: o.kernels[h].Name}, uint64(h)))
		case handlemap.KindStream:
			recs = append(recs, place(abi.OpStreamCreate, &abi.StreamCreate{}, uint64(h)))
		}
	})
	o.uploads.Pieces(stage) // after the modules: one may be an upload of the same image again
	return recs
}
