package worker

import "testing"

// TestToStart: spares all open at once while no context runs; refillAtOnce
// at most on their way once one does; never more than lack.
func TestToStart(t *testing.T) {
	for _, c := range []struct{ want, ready, starting, live, n int }{
		{16, 0, 0, 0, 16},               // a node starting: all at once
		{16, 15, 0, 1, 1},               // a session took one: one refill
		{16, 0, 0, 16, refillAtOnce},    // sixteen sessions took them all
		{16, 2, refillAtOnce, 16, 0},    // refillAtOnce already on their way
		{16, 0, refillAtOnce + 3, 4, 0}, // more on their way (started while idle)
		{16, 16, 0, 3, 0},               // none lacking
		{2, 1, 0, 5, 1},                 // fewer lacking than refillAtOnce
		{0, 0, 0, 0, 0},                 // no spares kept
		{4, 5, 0, 0, 0},                 // more ready than kept
		{16, 0, refillAtOnce - 1, 9, 1}, // room for one more
		{16, 10, 1, 0, 5},               // idle again: the rest at once
	} {
		if n := toStart(c.want, c.ready, c.starting, c.live); n != c.n {
			t.Errorf("toStart(want %d, ready %d, starting %d, live %d) = %d, want %d", c.want, c.ready, c.starting, c.live, n, c.n)
		}
	}
}
