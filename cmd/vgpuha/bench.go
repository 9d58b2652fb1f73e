package main

import "fmt"

func runBench(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: vgpuha bench pv [flags]")
	}
	switch args[0] {
	case "pv":
		return runBenchPV(args[1:])
	}
	return fmt.Errorf("unknown benchmark %q (have: pv)", args[0])
}

func runBenchPV(args []string) error { return fmt.Errorf("not yet") }
