package pvdriver

import "github.com/vgpuha/vgpuha/pvdriver/abi"

// Virtual memory management (abi's vmm.go): ranges of the session's
// window reserved without memory, and device memory mapped at exact
// addresses inside them. The node places and backs them, and its standby
// replays the same requests, so the addresses are the same there.

// ReserveAddress reserves size bytes of the window aligned to align (zero:
// the node's granularity), at hint if the node can (zero: anywhere).
func (c *Client) ReserveAddress(size, align, hint uint64) (DevicePtr, error) {
	var r abi.AllocReply
	err := c.call(abi.OpAddressReserve, &abi.AddressReserve{Size: size, Align: align, Hint: hint}, &r)
	return DevicePtr(r.Ptr), err
}

// FreeAddress frees the reservation [p, p+size), which holds no mapping.
func (c *Client) FreeAddress(p DevicePtr, size uint64) error {
	return c.call(abi.OpAddressFree, &abi.AddressFree{Ptr: uint64(p), Size: size}, nil)
}

// Map backs exactly [p, p+size), inside one reservation, with device
// memory.
func (c *Client) Map(p DevicePtr, size uint64) error {
	return c.call(abi.OpMemMap, &abi.MemMap{Ptr: uint64(p), Size: size}, nil)
}

// Unmap unmaps [p, p+size) (whole mappings) and frees their memory.
func (c *Client) Unmap(p DevicePtr, size uint64) error {
	return c.call(abi.OpMemUnmap, &abi.MemUnmap{Ptr: uint64(p), Size: size}, nil)
}
