package cli

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"math/big"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Every flag value is checked here, when it is set (from the command
// line, a VGPUHA_* variable or the config file, which then name where the
// value came from): numbers by range and sign (IntVar), sizes with their
// unit (SizeVar: 4096, 512KiB, 256MiB, 4GiB, 1TiB), durations and
// fractions by range, words against their list (choice), other strings by
// a check (checkedString). A command never takes a number through the flag
// package's own Int/Uint64/Duration flags (TestEveryNumericFlagIsRanged):
// those accept -5 where a count is meant, and 4GiB nowhere.

// usageError is a command line or configuration the command refuses
// before it starts anything: vgpuha exits 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// Usage marks err as a usage error: the program prints it and exits 2.
func Usage(err error) error { return usageError{err} }

// Parse parses args into fs; a refused flag or value comes back as a
// usageError of one line, naming the flag with its two dashes, and an
// unknown flag with the closest one fs has.
func Parse(fs *flag.FlagSet, args []string) error {
	err := fs.Parse(args)
	if err == nil || errors.Is(err, flag.ErrHelp) {
		return err
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		msg = "unknown flag --" + strings.TrimPrefix(name, "-")
		if s := suggestFlag(fs, name); s != "" {
			msg += fmt.Sprintf(" (did you mean --%s?)", s)
		}
	}
	for _, dash := range []string{"for flag -", "for -", "argument: -"} {
		msg = strings.Replace(msg, dash, strings.TrimSuffix(dash, "-")+"--", 1)
	}
	return usageError{fmt.Errorf("%s; '%s %s --help' lists the flags", msg, current.Name, fs.Name())}
}

// suggestFlag is fs's flag closest to the mistyped name, or "".
func suggestFlag(fs *flag.FlagSet, typed string) string {
	typed = strings.TrimLeft(typed, "-")
	if i := strings.IndexByte(typed, '='); i >= 0 {
		typed = typed[:i]
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return Closest(typed, names)
}

// Closest is the name nearest to typed: within a third of its length in
// edits, or one whose dotted part it is ("key-file" for
// "replicate.key-file"); "" when none is near.
func Closest(typed string, names []string) string {
	best, bestDist := "", len(typed)/3+1
	for _, name := range names {
		d := editDistance(typed, name)
		if strings.HasSuffix(name, "."+typed) || strings.HasPrefix(name, typed+".") {
			d = min(d, 1)
		}
		if d < bestDist {
			best, bestDist = name, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

// integer is what an IntVar or SizeVar may hold.
type integer interface{ ~int | ~int64 | ~uint64 }

// intValue is an integer flag that refuses values outside [min, max]; a
// size (bytes) also takes a KiB, MiB, GiB or TiB suffix and prints with
// the largest that divides it.
type intValue[T integer] struct {
	p        *T
	min, max T
	bytes    bool
}

// IntVar registers an integer flag holding a value in [lo, hi].
func IntVar[T integer](fs *flag.FlagSet, p *T, name string, def, lo, hi T, usage string) {
	*p = def
	fs.Var(&intValue[T]{p: p, min: lo, max: hi}, name, usage)
}

// SizeVar registers a size in bytes in [lo, hi], with or without a unit.
func SizeVar[T integer](fs *flag.FlagSet, p *T, name string, def, lo, hi T, usage string) {
	*p = def
	fs.Var(&intValue[T]{p: p, min: lo, max: hi, bytes: true}, name, usage)
}

// IntValue and SizeValue are the checked values of IntVar and SizeVar,
// for fields parsed outside a flag set (a --tenant.quota's parts).
func IntValue[T integer](p *T, lo, hi T) flag.Value { return &intValue[T]{p: p, min: lo, max: hi} }

func SizeValue[T integer](p *T, lo, hi T) flag.Value {
	return &intValue[T]{p: p, min: lo, max: hi, bytes: true}
}

// Int and Size are IntVar and SizeVar returning the variable.
func Int[T integer](fs *flag.FlagSet, name string, def, lo, hi T, usage string) *T {
	p := new(T)
	IntVar(fs, p, name, def, lo, hi, usage)
	return p
}

func Size[T integer](fs *flag.FlagSet, name string, def, lo, hi T, usage string) *T {
	p := new(T)
	SizeVar(fs, p, name, def, lo, hi, usage)
	return p
}

// The largest values each kind of integer flag may be given.
const (
	MaxInt    = math.MaxInt
	MaxInt64  = math.MaxInt64
	MaxUint64 = math.MaxUint64
)

func (v *intValue[T]) String() string {
	if v.p == nil {
		return "0"
	}
	if v.bytes {
		return FormatBytes(uint64(*v.p))
	}
	return fmt.Sprint(*v.p)
}

func (v *intValue[T]) Set(s string) error {
	n, err := parseInteger(s, v.bytes)
	if err != nil {
		return err
	}
	lo, hi := bigOf(v.min), bigOf(v.max)
	if n.Cmp(lo) < 0 || n.Cmp(hi) > 0 {
		return fmt.Errorf("out of range: want %s", v.rangeText())
	}
	if n.Sign() < 0 {
		*v.p = T(n.Int64())
	} else {
		*v.p = T(n.Uint64())
	}
	return nil
}

// rangeText says which values the flag takes.
func (v *intValue[T]) rangeText() string {
	show := func(x T) string {
		if v.bytes {
			return FormatBytes(uint64(x))
		}
		return fmt.Sprint(x)
	}
	what := "a whole number"
	if v.bytes {
		what = "a size (bytes, or with KiB, MiB, GiB or TiB)"
	}
	if bigOf(v.max).Cmp(big.NewInt(MaxInt64)) >= 0 {
		if v.min == 0 {
			return what + ", not negative"
		}
		return fmt.Sprintf("%s of at least %s", what, show(v.min))
	}
	return fmt.Sprintf("%s from %s to %s", what, show(v.min), show(v.max))
}

func bigOf[T integer](x T) *big.Int {
	if x < 0 {
		return big.NewInt(int64(x))
	}
	return new(big.Int).SetUint64(uint64(x))
}

// byteUnits are the suffixes a size takes, largest first.
var byteUnits = []struct {
	suffix string
	mult   uint64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}}

// parseInteger reads a whole number (decimal, or 0x hex), and for a size
// an optional unit: 4096, 256MiB, 4 GiB.
func parseInteger(s string, bytes bool) (*big.Int, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	if bytes {
		for _, u := range byteUnits {
			if rest, ok := strings.CutSuffix(t, u.suffix); ok {
				t, mult = strings.TrimSpace(rest), u.mult
				break
			}
		}
	}
	n, ok := new(big.Int).SetString(t, 0)
	if !ok {
		if bytes {
			return nil, fmt.Errorf("%q is not a size (want bytes, or a whole number with KiB, MiB, GiB or TiB: 4096, 256MiB, 4GiB)", s)
		}
		return nil, fmt.Errorf("%q is not a whole number", s)
	}
	return n.Mul(n, new(big.Int).SetUint64(mult)), nil
}

// FormatBytes writes n with the largest unit that divides it.
func FormatBytes(n uint64) string {
	for _, u := range byteUnits[:4] {
		if n != 0 && n%u.mult == 0 {
			return strconv.FormatUint(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatUint(n, 10)
}

// parseBytes reads one positive size such as 4096, 256MiB or 4GiB (a
// list flag's element; single sizes are SizeVar flags).
func parseBytes(s string) (uint64, error) {
	var n uint64
	v := intValue[uint64]{p: &n, min: 1, max: MaxUint64, bytes: true}
	if err := v.Set(s); err != nil {
		return 0, err
	}
	return n, nil
}

// ParseSizeList reads a comma-separated list of positive sizes.
func ParseSizeList(s string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(s, ",") {
		n, err := parseBytes(f)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, nil
}

// durationValue is a duration flag that refuses values outside [min, max].
type durationValue struct {
	p        *time.Duration
	min, max time.Duration
}

// DurationVar registers a duration flag holding a value in [lo, hi].
func DurationVar(fs *flag.FlagSet, p *time.Duration, name string, def, lo, hi time.Duration, usage string) {
	*p = def
	fs.Var(&durationValue{p: p, min: lo, max: hi}, name, usage)
}

func Duration(fs *flag.FlagSet, name string, def, lo, hi time.Duration, usage string) *time.Duration {
	p := new(time.Duration)
	DurationVar(fs, p, name, def, lo, hi, usage)
	return p
}

// MaxDuration is a duration flag without an upper bound.
const MaxDuration = time.Duration(math.MaxInt64)

func (v *durationValue) String() string {
	if v.p == nil {
		return "0s"
	}
	return v.p.String()
}

func (v *durationValue) Set(s string) error {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not a duration (want e.g. 250ms, 10s, 2m)", s)
	}
	if d < v.min || d > v.max {
		if v.max == MaxDuration {
			return fmt.Errorf("out of range: want a duration of at least %v", v.min)
		}
		return fmt.Errorf("out of range: want a duration from %v to %v", v.min, v.max)
	}
	*v.p = d
	return nil
}

// optionalDuration is a duration flag that may also stand alone: bare
// (--watch) it takes its bare value; --watch=2s, or --watch 2s read by
// TakeOptionalValue, sets the duration.
type optionalDuration struct {
	durationValue
	bare time.Duration
}

// OptionalDuration registers a duration flag in [lo, hi] (default 0)
// that, given bare, holds bare.
func OptionalDuration(fs *flag.FlagSet, name string, bare, lo, hi time.Duration, usage string) *time.Duration {
	v := &optionalDuration{durationValue: durationValue{p: new(time.Duration), min: lo, max: hi}, bare: bare}
	fs.Var(v, name, usage)
	return v.p
}

func (v *optionalDuration) IsBoolFlag() bool { return true }

func (v *optionalDuration) Set(s string) error {
	switch s {
	case "true":
		*v.p = v.bare
		return nil
	case "false":
		*v.p = 0
		return nil
	}
	return v.durationValue.Set(s)
}

// ParseOptional is Parse for a flag set with OptionalDuration flags: an
// argument after such a flag given bare that reads as a duration is its
// value (--watch 2s), and parsing goes on after it. Any other argument
// left is refused.
func ParseOptional(fs *flag.FlagSet, args []string) error {
	if err := Parse(fs, args); err != nil {
		return err
	}
	for fs.NArg() > 0 {
		rest := fs.Args()
		last := lastFlag(args[:len(args)-len(rest)])
		f := fs.Lookup(last)
		opt, ok := (*optionalDuration)(nil), f != nil
		if ok {
			opt, ok = f.Value.(*optionalDuration)
		}
		if !ok || opt.Set(rest[0]) != nil {
			return usageError{fmt.Errorf("unexpected argument %q; '%s %s --help' lists the flags", rest[0], current.Name, fs.Name())}
		}
		args = rest[1:]
		if err := Parse(fs, args); err != nil {
			return err
		}
	}
	return nil
}

// lastFlag is the name of the last argument of args if it is a flag
// given without a value ("--watch"), else "".
func lastFlag(args []string) string {
	if len(args) == 0 {
		return ""
	}
	a := args[len(args)-1]
	if !strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
		return ""
	}
	return strings.TrimLeft(a, "-")
}

// fractionValue is a number flag in [min, below).
type fractionValue struct {
	p          *float64
	min, below float64
}

// FractionVar registers a number flag at least lo and below hi.
func FractionVar(fs *flag.FlagSet, p *float64, name string, def, lo, below float64, usage string) {
	*p = def
	fs.Var(&fractionValue{p: p, min: lo, below: below}, name, usage)
}

func (v *fractionValue) String() string {
	if v.p == nil {
		return "0"
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v *fractionValue) Set(s string) error {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || math.IsNaN(f) {
		return fmt.Errorf("%q is not a number", s)
	}
	if f < v.min || f >= v.below {
		return fmt.Errorf("out of range: want a number from %v and below %v", v.min, v.below)
	}
	*v.p = f
	return nil
}

// checkedString is a string flag whose every value passes check.
type checkedString struct {
	p     *string
	check func(string) error
}

// StringVar registers a string flag that refuses what check refuses (the
// default is not checked: "" often means off).
func StringVar(fs *flag.FlagSet, p *string, name, def string, check func(string) error, usage string) {
	*p = def
	fs.Var(&checkedString{p: p, check: check}, name, usage)
}

func String(fs *flag.FlagSet, name, def string, check func(string) error, usage string) *string {
	p := new(string)
	StringVar(fs, p, name, def, check, usage)
	return p
}

func (v *checkedString) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v *checkedString) Set(s string) error {
	if err := v.check(s); err != nil {
		return err
	}
	*v.p = s
	return nil
}

// Choice registers a choice flag (one of allowed) and returns its value.
func Choice(fs *flag.FlagSet, name, def string, allowed []string, usage string) *string {
	c := &choice{value: def, allowed: allowed}
	fs.Var(c, name, usage)
	return &c.value
}

// LogFlag adds --log.level and --log.format (checked when the flags are
// parsed) and returns a constructor for the logger.
func LogFlag(fs *flag.FlagSet) func() *slog.Logger {
	level := &choice{value: "info", allowed: []string{"debug", "info", "warn", "error"}}
	format := &choice{value: "text", allowed: []string{"text", "json"}}
	fs.Var(level, "log.level", "log level: debug, info, warn or error")
	fs.Var(format, "log.format", "log format: text or json")
	return func() *slog.Logger {
		var l slog.Level
		l.UnmarshalText([]byte(strings.ToUpper(level.value))) // one of the allowed names
		opts := &slog.HandlerOptions{Level: l}
		if format.value == "json" {
			return slog.New(slog.NewJSONHandler(os.Stderr, opts))
		}
		return slog.New(slog.NewTextHandler(os.Stderr, opts))
	}
}

// choice is a flag whose value is one of a fixed set of words.
type choice struct {
	value   string
	allowed []string
}

func (c *choice) String() string { return c.value }

func (c *choice) Set(v string) error {
	if !slices.Contains(c.allowed, v) {
		return fmt.Errorf("want %s", strings.Join(c.allowed, ", "))
	}
	c.value = v
	return nil
}
