// Package admission owns whom a standby lets stream to its replica: the
// identity a primary presents (group, id, term, log position), the rules
// that admit or refuse it (View.Admit, first match wins), the reasons a
// refusal gives, and the error a refused primary reports.
//
// It decides only: it never touches a link, a replica or a term; the
// receiver asks it before it lets go of the link it has, and replicate
// carries identities and refusals on the wire.
//
// Identity and terms on the link (protocol 5):
//
// A primary introduces itself before anything else on an authenticated
// link (msgIdentity), and the standby decides whether it may stream
// before it lets go of the link it has, so a refused primary never
// touches the replica: no reset, no resync, no link dropped. A standby
// remembers the primary it follows (its group, its id and its term) and
// refuses, with a reason both ends log and count:
//
//   - another group's primary, even at a higher term: the pair's group is
//     a name an operator gave (--group) or, without one, the first
//     primary's id, which a standby that takes over passes on to its own
//     standbys;
//   - a primary below the term it follows (a deposed one): the primary is
//     told the term and fences itself;
//   - another primary at the term it follows (two primaries cannot hold
//     one term: a stray started with the same configuration);
//   - the primary it follows at a log position behind what the replica
//     applied from that log (a primary restored from an image: its guests
//     went back in time, the standby did not).
//
// A standby that follows no one yet (it started empty: nothing to lose)
// takes the first primary of its group (--group, when set), and one whose
// operator armed an adoption (--adopt) takes the next primary whatever
// its group or id, once. With a coordinator, the leader of record (the
// term the coordinator's election gave) is admitted whoever the standby
// followed, and a primary below it is refused. A promoted standby refuses
// every primary and tells it the newer term (msgFenced), as before.
package admission
