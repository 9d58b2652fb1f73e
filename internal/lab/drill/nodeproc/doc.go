// Package nodeproc owns one vgpuha node process as the lab drives it: the
// child process, a client for its admin endpoint (a unix socket, reachable
// from any network namespace), the parts of its /status the lab reads (a
// standby's Promotion), and the polling and loopback-address helpers the
// drill, the demo and the soak share.
//
// It never decides what a drill strikes or whether one passed, and never
// reaches into a node but through its admin endpoint and its process.
package nodeproc
