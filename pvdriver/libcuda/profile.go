package main

import (
	"fmt"
	"os"
	"runtime/pprof"
	"sync"
)

// The library's own CPU profile, for finding where a guest's time goes in
// this library (issue 43's per-step costs): VGPUHA_CPUPROFILE=FILE writes
// a pprof CPU profile of the library's Go code from cuInit to the process's
// exit (`go tool pprof FILE`). Off unless set; a file that cannot be made
// is named on stderr and the program carries on unprofiled.

var profile struct {
	once sync.Once
	mu   sync.Mutex
	f    *os.File
}

// startProfile starts the profile once, if VGPUHA_CPUPROFILE asks for one.
func startProfile() {
	profile.once.Do(func() {
		path := os.Getenv("VGPUHA_CPUPROFILE")
		if path == "" {
			return
		}
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "vgpuha libcuda: VGPUHA_CPUPROFILE: %v (not profiling)\n", err)
			return
		}
		profile.mu.Lock()
		profile.f = f
		profile.mu.Unlock()
	})
}

// stopProfile ends the profile and closes its file, if one is running.
func stopProfile() {
	profile.mu.Lock()
	defer profile.mu.Unlock()
	if profile.f != nil {
		pprof.StopCPUProfile()
		profile.f.Close()
		profile.f = nil
	}
}
