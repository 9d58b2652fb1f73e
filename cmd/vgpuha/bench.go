package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/vgpuha/vgpuha/bench"
)

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

func runBenchPV(args []string) error {
	fs := newFlags("bench pv", "[flags]")
	var opts bench.PVOptions
	fs.IntVar(&opts.Rounds, "rounds", 7, "interleaved rounds; the report gives each configuration's median")
	fs.IntVar(&opts.Batch, "batch", 2000, "operations per timed batch")
	asJSON := fs.Bool("json", false, "print JSON rows instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	opts.Progress = os.Stderr
	rows, err := bench.PV(opts)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(os.Stdout).Encode(rows)
	}
	fmt.Println("paravirtual call cost vs the software GPU called in-process (medians of interleaved rounds)")
	bench.PrintPV(os.Stdout, rows)
	return nil
}
