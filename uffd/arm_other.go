//go:build !linux

package uffd

// ArmWriteTracking is Linux-only.
func ArmWriteTracking([]byte) (int, error) { return -1, ErrUnsupported }
