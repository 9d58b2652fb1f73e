package hypervisor_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// minimalCubin is an ELF header for a CUDA GPU with one (null) section:
// framing the hypervisor accepts, code no GPU would run.
func minimalCubin() []byte {
	le := binary.LittleEndian
	b := make([]byte, 64+64)
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[18:], 190) // EM_CUDA
	le.PutUint64(b[40:], 64)  // section headers right after the ELF header
	le.PutUint16(b[58:], 64)
	le.PutUint16(b[60:], 1)
	return b
}

// TestRawImagesRefusedWhereTheyCannotRun: a cubin is a guest's own machine
// code, so a primary serving several guests refuses it naming the setting
// to change; the software GPU refuses it naming the backend that runs it;
// broken framing is refused before any backend sees it. Each refusal fails
// only that request.
func TestRawImagesRefusedWhereTheyCannotRun(t *testing.T) {
	wire, err := abi.RawImage(abi.FormatCubin, minimalCubin())
	if err != nil {
		t.Fatal(err)
	}
	oneGuest := hypervisor.DefaultConfig()
	oneGuest.GuestKernels, oneGuest.MaxSessions = true, 1
	broken := append([]byte(nil), wire...)
	binary.LittleEndian.PutUint16(broken[len(broken)-len(minimalCubin())+18:], 62) // an x86 ELF
	for _, c := range []struct {
		name   string
		cfg    hypervisor.Config
		image  []byte
		status abi.Status
		says   string
	}{
		{"shared primary", hypervisor.DefaultConfig(), wire, abi.StatusNotSupported, "--guest.kernels (with --guest.workers on each guest in a GPU worker"},
		{"software GPU", oneGuest, wire, abi.StatusNotSupported, "needs --backend cuda"},
		{"broken framing", oneGuest, broken, abi.StatusInvalidValue, "not a CUDA GPU"},
	} {
		t.Run(c.name, func(t *testing.T) {
			g := start(t, c.cfg).client(t, "g")
			_, err := g.LoadModule(c.image)
			if !errors.Is(err, c.status) || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("LoadModule: %v; want %v saying %q", err, c.status, c.says)
			}
			mustAlloc(t, g, 4096, 1) // the session carries on
		})
	}
}
