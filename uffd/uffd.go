// Package uffd arms userfaultfd's asynchronous write-protection on a
// memory range: the guest's half of the uffd aperture mode, shared by the
// guest driver (pvdriver, which arms its apertures) and the tracer's tests
// and feature probe (mmiotrace, which collects the written pages with
// PAGEMAP_SCAN). It owns only the arming; it must never read or re-arm
// pages (that is the tracer's) and links nothing but x/sys.
package uffd

import "errors"

// ErrUnsupported: this system has no userfaultfd.
var ErrUnsupported = errors.New("userfaultfd write tracking needs Linux")
