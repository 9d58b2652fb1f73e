package abi

// Module-scope variables (__device__ and __constant__ globals of a loaded
// module). Their addresses are the backend's, outside the session's window,
// and differ between a primary and its standby: a guest finds one by
// module and name (ModuleGlobal) and copies into and out of it by name
// (GlobalWrite, GlobalRead), so a write replicates as the same named write
// and lands in the standby's own copy of the variable.

// MaxGlobalCopy bounds one GlobalWrite's data and one GlobalRead's length.
const MaxGlobalCopy = MaxModuleImage

// ModuleGlobal asks where a module's variable lies (cuModuleGetGlobal).
type ModuleGlobal struct {
	Module uint64
	Name   string
}

// GlobalReply is a variable's address on the node that answered, and its size.
type GlobalReply struct{ Addr, Size uint64 }

// GlobalWrite copies Data into a module's variable at Offset.
type GlobalWrite struct {
	Module uint64
	Name   string
	Offset uint64
	Data   []byte
}

// GlobalRead copies Length bytes of a module's variable from Offset
// (replied as a DataReply).
type GlobalRead struct {
	Module uint64
	Name   string
	Offset uint64
	Length uint32
}

func (m *ModuleGlobal) Append(b []byte) []byte { return appendString(appendU64(b, m.Module), m.Name) }
func (r *GlobalReply) Append(b []byte) []byte  { return appendU64(appendU64(b, r.Addr), r.Size) }
func (m *GlobalWrite) Append(b []byte) []byte {
	return appendBytes(appendU64(appendString(appendU64(b, m.Module), m.Name), m.Offset), m.Data)
}
func (m *GlobalRead) Append(b []byte) []byte {
	b = appendU64(appendString(appendU64(b, m.Module), m.Name), m.Offset)
	return append(b, byte(m.Length), byte(m.Length>>8), byte(m.Length>>16), byte(m.Length>>24))
}

func (m *ModuleGlobal) decode(d *Decoder) { m.Module = d.U64(); m.Name = d.String(MaxKernelName) }
func (r *GlobalReply) decode(d *Decoder)  { r.Addr = d.U64(); r.Size = d.U64() }
func (m *GlobalWrite) decode(d *Decoder) {
	m.Module, m.Name, m.Offset = d.U64(), d.String(MaxKernelName), d.U64()
	m.Data = d.Bytes(MaxGlobalCopy)
}
func (m *GlobalRead) decode(d *Decoder) {
	m.Module, m.Name, m.Offset, m.Length = d.U64(), d.String(MaxKernelName), d.U64(), d.U32()
}
