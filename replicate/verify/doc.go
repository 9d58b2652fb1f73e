// Package verify owns what verification compares: one object's checksum
// at a log position (ObjectSum, Checksum, an aperture's byte comparison),
// the comparison of the primary's checksums with a standby's (Compare,
// Report), and the rendezvous that pairs a verify point taken on the
// primary with the answer that comes back on the link (Verifier).
//
// It is pure bookkeeping over checksums: it never reads device memory,
// never takes a checksum of a replica itself (the hypervisor does), and
// never touches the link; replicate carries the request (OpVerify) and
// the answer.
package verify
