package replicate

import "testing"

// TestReadNeeds: a need is taken once; past maxReadNeeds kept needs (ones
// that came after their reply stopped waiting) the oldest goes, never the
// newest, which a reply may be waiting for; a check's body round-trips and
// a body of another size is refused.
func TestReadNeeds(t *testing.T) {
	l := NewLog(1 << 20)
	for seq := uint64(1); seq <= maxReadNeeds+10; seq++ {
		l.NoteReadNeed(seq)
	}
	if l.TakeReadNeed(1) {
		t.Error("the oldest need was kept past the bound")
	}
	if !l.TakeReadNeed(maxReadNeeds+10) || l.TakeReadNeed(maxReadNeeds+10) {
		t.Error("the newest need: want it taken once")
	}
	if l.TakeReadNeed(maxReadNeeds + 11) {
		t.Error("a need nobody noted")
	}
	c := ReadCheck{Addr: 0x7e0000001000, Stream: 3, N: 1 << 20, Sum: 99}
	if got, err := DecodeReadCheck(AppendReadCheck(nil, c)); err != nil || got != c {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	if _, err := DecodeReadCheck(make([]byte, readCheckSize+1)); err == nil {
		t.Error("a body of the wrong size was decoded")
	}
	if l.ReadCheckMin() != DefaultReadCheckMin {
		t.Errorf("a new log checks reads from %d bytes, want %d", l.ReadCheckMin(), DefaultReadCheckMin)
	}
}
