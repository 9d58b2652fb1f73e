package pvdriver

import (
	"fmt"

	"github.com/vgpuha/vgpuha/pvdriver/abi"
)

// Module variables (__device__ and __constant__ globals), by module and
// name: their addresses are the node's and change at a failover, so a
// guest copies into and out of them by name (abi/globals.go).

// ModuleGlobal returns where variable name of m lies on the node that
// answered, and its size.
func (c *Client) ModuleGlobal(m Module, name string) (addr, size uint64, err error) {
	var r abi.GlobalReply
	err = c.call(abi.OpModuleGlobal, &abi.ModuleGlobal{Module: uint64(m), Name: name}, &r)
	return r.Addr, r.Size, err
}

// WriteGlobal copies src into variable name of m at off, after the
// session's earlier work.
func (c *Client) WriteGlobal(m Module, name string, off uint64, src []byte) error {
	return c.call(abi.OpGlobalWrite, &abi.GlobalWrite{Module: uint64(m), Name: name, Offset: off, Data: src}, nil)
}

// ReadGlobal copies len(dst) bytes of variable name of m from off, after
// the session's earlier work.
func (c *Client) ReadGlobal(dst []byte, m Module, name string, off uint64) error {
	var r abi.DataReply
	if err := c.call(abi.OpGlobalRead, &abi.GlobalRead{Module: uint64(m), Name: name, Offset: off, Length: uint32(len(dst))}, &r); err != nil {
		return err
	}
	if len(r.Data) != len(dst) {
		return fmt.Errorf("pvdriver: reading module variable %q: %d bytes came back, %d asked", name, len(r.Data), len(dst))
	}
	copy(dst, r.Data)
	return nil
}
