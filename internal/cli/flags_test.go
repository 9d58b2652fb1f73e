package cli

import (
	"errors"
	"flag"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestSizeFlag(t *testing.T) {
	for _, c := range []struct {
		in   string
		want uint64
		err  string
	}{
		{"4096", 4096, ""},
		{"4GiB", 4 << 30, ""},
		{"256 MiB", 256 << 20, ""},
		{"1TiB", 1 << 40, ""},
		{"0x1000", 4096, ""},
		{"-5", 0, "out of range"},
		{"0", 0, "out of range"},
		{"4GB", 0, "not a size"},
		{"lots", 0, "not a size"},
		{"99999999999TiB", 0, "out of range"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var n uint64
		SizeVar(fs, &n, "size", 1, 1, MaxUint64, "")
		err := fs.Set("size", c.in)
		switch {
		case c.err == "" && (err != nil || n != c.want):
			t.Errorf("%q: %d, %v; want %d", c.in, n, err, c.want)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v; want an error with %q", c.in, err, c.err)
		}
	}
	if got := FormatBytes(4 << 30); got != "4GiB" {
		t.Errorf("FormatBytes(4 GiB) = %q", got)
	}
}

func TestIntAndDurationFlags(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	rounds := Int(fs, "rounds", 7, 1, 1000, "")
	var lag int64
	SizeVar(fs, &lag, "lag", 1<<20, 1<<20, MaxInt64, "")
	wait := Duration(fs, "wait", time.Second, 0, time.Hour, "")
	for _, bad := range [][2]string{{"rounds", "0"}, {"rounds", "-3"}, {"rounds", "1001"}, {"rounds", "2.5"},
		{"lag", "-1"}, {"lag", "9223372036854775808"}, {"wait", "-1s"}, {"wait", "2h"}, {"wait", "soon"}} {
		if err := fs.Set(bad[0], bad[1]); err == nil {
			t.Errorf("--%s %s accepted", bad[0], bad[1])
		}
	}
	if *rounds != 7 || lag != 1<<20 || *wait != time.Second {
		t.Errorf("a refused value changed the flag: %d %d %v", *rounds, lag, *wait)
	}
	if err := fs.Set("lag", "64MiB"); err != nil || lag != 64<<20 {
		t.Errorf("--lag 64MiB: %d, %v", lag, err)
	}
}

// TestParseFlagsOneLine: an unknown flag is one line naming the closest
// flag; a refused value names the flag with two dashes; both are usage
// errors (exit 2).
func TestParseFlagsOneLine(t *testing.T) {
	fs := NewFlags("primary", "")
	fs.String("guest-listen", "", "")
	fs.String("replicate.key-file", "", "")
	Int(fs, "replicate.min-in-sync", 1, 1, 64, "")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--gust-listen", "x"}, "unknown flag --gust-listen (did you mean --guest-listen?)"},
		{[]string{"--key-file", "x"}, "did you mean --replicate.key-file?"},
		{[]string{"--zzzzzzzzzz"}, "unknown flag --zzzzzzzzzz;"},
		{[]string{"--replicate.min-in-sync", "0"}, `invalid value "0" for flag --replicate.min-in-sync: out of range`},
		{[]string{"--guest-listen"}, "flag needs an argument: --guest-listen"},
	} {
		err := Parse(fs, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || !errors.As(err, new(usageError)) {
			t.Errorf("%v: %v; want one usage line with %q", c.args, err, c.want)
		}
	}
}

// TestOptionalDuration: --watch alone takes its bare value; with a
// duration after it, joined or not, that duration; anything else left on
// the line is refused.
func TestOptionalDuration(t *testing.T) {
	for _, c := range []struct {
		args []string
		want time.Duration
		json bool
		err  string
	}{
		{nil, 0, false, ""},
		{[]string{"--watch"}, time.Second, false, ""},
		{[]string{"--watch", "--json"}, time.Second, true, ""},
		{[]string{"--watch", "250ms"}, 250 * time.Millisecond, false, ""},
		{[]string{"--watch", "2s", "--json"}, 2 * time.Second, true, ""},
		{[]string{"--json", "--watch=3s"}, 3 * time.Second, true, ""},
		{[]string{"--watch", "soon"}, 0, false, `unexpected argument "soon"`},
		{[]string{"--json", "extra"}, 0, false, `unexpected argument "extra"`},
		{[]string{"--watch=0s"}, 0, false, "out of range"},
	} {
		fs := flag.NewFlagSet("status", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		watch := OptionalDuration(fs, "watch", time.Second, time.Millisecond, MaxDuration, "")
		asJSON := fs.Bool("json", false, "")
		err := ParseOptional(fs, c.args)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.err)
		case c.err == "" && (err != nil || *watch != c.want || *asJSON != c.json):
			t.Errorf("%q: watch %v json %v (%v), want %v %v", c.args, *watch, *asJSON, err, c.want, c.json)
		}
	}
}

// TestMisspeltEnv: a VGPUHA_ variable one typo from a flag's variable is
// named with the one meant; an exact one, one far from every flag (another
// command's, the guest library's) and other variables are not.
func TestMisspeltEnv(t *testing.T) {
	fs := flag.NewFlagSet("primary", flag.ContinueOnError)
	fs.String("replicate.key-file", "", "")
	fs.String("guest-listen", "", "")
	got := misspeltEnv(fs, []string{
		"VGPUHA_REPLICATE_KEYFILE=/k", "VGPUHA_GUEST_LISTEN=unix:///s", "VGPUHA_ENDPOINT=unix:///s",
		"VGPUHA_GEUST_LISTEN=x", "HOME=/root", "VGPUHA_DEBUG=1",
	})
	want := []string{
		"VGPUHA_GEUST_LISTEN sets no flag of this command (did you mean VGPUHA_GUEST_LISTEN, for --guest-listen?)",
		"VGPUHA_REPLICATE_KEYFILE sets no flag of this command (did you mean VGPUHA_REPLICATE_KEY_FILE, for --replicate.key-file?)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}
