//go:build race

package hypervisor_test

const raceDetector = true
