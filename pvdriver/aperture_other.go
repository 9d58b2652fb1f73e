//go:build !linux

package pvdriver

// Apertures share a sealed memfd with the hypervisor, which only Linux
// has: elsewhere MapAperture fails before it allocates anything, so no
// aperture ever exists to release or unprotect.

func (a *Aperture) mapFile(uint64) error { return ErrAperturesUnsupported }

func (a *Aperture) release() {}

// Precondition: c.mu must be locked.
func (c *Client) unprotectApertures() {}
