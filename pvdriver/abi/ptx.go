package abi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// PTX, as a guest's program loads it (cuModuleLoadData and friends), is
// text: this file finds its kernel entries and their parameter layouts, so
// a guest driver can marshal cuLaunchKernel's kernelParams and the
// hypervisor can check a raw image's framing. Grammar: PTX ISA, "Kernel
// Function Parameters" (.entry name(.param .type [.ptr ...] [.align N] name[[N]], ...)).

// ErrBadPTX reports PTX text this parser cannot read.
var ErrBadPTX = errors.New("abi: malformed PTX")

// PTXParam is one kernel parameter: its PTX type and its place in a packed
// parameter buffer (CU_LAUNCH_PARAM_BUFFER_POINTER).
type PTXParam struct {
	Name  string
	Type  string // b8 … f64, without the dot
	Size  int    // bytes: the type's size times the array length
	Align int
}

// Kind is the wire kind a launch sends the parameter as: scalars of their
// type, anything else (arrays, structs, 8- and 16-bit values) as bytes.
// A 64-bit integer is ArgU64: only the library's declarations say which
// parameters are pointers.
func (p PTXParam) Kind() ArgKind {
	switch {
	case p.Type == "f32" && p.Size == 4:
		return ArgF32
	case p.Type == "f64" && p.Size == 8:
		return ArgF64
	case typeSize(p.Type) == 8 && p.Size == 8:
		return ArgU64
	case typeSize(p.Type) == 4 && p.Size == 4:
		return ArgU32
	}
	return ArgBytes
}

// PTXEntry is one kernel (.entry) of a PTX module.
type PTXEntry struct {
	Name   string
	Params []PTXParam
}

// Offsets are the parameters' offsets in a packed buffer, each aligned to
// its own alignment, and the buffer's total size.
func (e PTXEntry) Offsets() (offs []int, total int) {
	for _, p := range e.Params {
		total = (total + p.Align - 1) / p.Align * p.Align
		offs = append(offs, total)
		total += p.Size
	}
	return offs, total
}

// PTXVersion is the module's .version directive as major*10+minor (7.0 is
// 70), or zero when it has none.
func PTXVersion(text string) int {
	i := strings.Index(text, ".version")
	if i < 0 {
		return 0
	}
	f := strings.Fields(text[i+len(".version"):])
	if len(f) == 0 {
		return 0
	}
	major, minor, _ := strings.Cut(f[0], ".")
	a, err1 := strconv.Atoi(major)
	b, err2 := strconv.Atoi(minor)
	if err1 != nil || err2 != nil || a > 99 || b > 9 {
		return 0
	}
	return a*10 + b
}

func typeSize(t string) int {
	switch t {
	case "b8", "u8", "s8", "pred":
		return 1
	case "b16", "u16", "s16", "f16", "bf16":
		return 2
	case "b32", "u32", "s32", "f32", "f16x2", "bf16x2":
		return 4
	case "b64", "u64", "s64", "f64":
		return 8
	}
	return 0
}

// IsPTX reports whether b looks like PTX text: it declares a .version and
// holds no NUL before an optional terminating one.
func IsPTX(b []byte) bool {
	if n := len(b); n > 0 && b[n-1] == 0 {
		b = b[:n-1]
	}
	s := string(b)
	return strings.Contains(s, ".version") && !strings.ContainsRune(s, 0) && utf8.ValidString(s)
}

// ParsePTX lists the kernel entries of PTX text, with their parameters.
// It reads only the declarations: what the code does is the JIT's business.
func ParsePTX(text string) ([]PTXEntry, error) {
	toks := ptxTokens(text)
	var entries []PTXEntry
	seen := map[string]bool{}
	for i := 0; i < len(toks); i++ {
		if toks[i] != ".entry" {
			continue
		}
		if i+1 >= len(toks) || !ptxIdent(toks[i+1]) {
			return nil, fmt.Errorf("%w: .entry without a name", ErrBadPTX)
		}
		e := PTXEntry{Name: toks[i+1]}
		if len(e.Name) > MaxKernelName || seen[e.Name] {
			return nil, fmt.Errorf("%w: entry name %.40q too long or repeated", ErrBadPTX, e.Name)
		}
		seen[e.Name] = true
		i += 2
		if i < len(toks) && toks[i] == "(" {
			var err error
			if e.Params, i, err = ptxParams(toks, i+1); err != nil {
				return nil, fmt.Errorf("%w: entry %s: %w", ErrBadPTX, e.Name, err)
			}
		}
		if _, total := e.Offsets(); len(e.Params) > MaxArgs || total > MaxParamBytes {
			return nil, fmt.Errorf("%w: entry %s takes %d parameters (%d bytes), limits %d and %d",
				ErrBadPTX, e.Name, len(e.Params), total, MaxArgs, MaxParamBytes)
		}
		entries = append(entries, e)
		if len(entries) > MaxKernels {
			return nil, fmt.Errorf("%w: more than %d entries", ErrBadPTX, MaxKernels)
		}
	}
	if len(entries) == 0 {
		return nil, fmt.Errorf("%w: no .entry", ErrBadPTX)
	}
	return entries, nil
}

// ptxParams reads parameter declarations from toks[i:] up to the closing
// parenthesis and returns the index of that parenthesis.
func ptxParams(toks []string, i int) ([]PTXParam, int, error) {
	var ps []PTXParam
	for ; i < len(toks) && toks[i] != ")"; i++ {
		if toks[i] == "," {
			continue
		}
		if toks[i] != ".param" {
			return nil, i, fmt.Errorf("want .param, got %.20q", toks[i])
		}
		p := PTXParam{}
		for i++; i < len(toks) && toks[i] != "," && toks[i] != ")"; i++ {
			switch t := toks[i]; {
			case t == ".align" && i+1 < len(toks):
				n, err := strconv.Atoi(toks[i+1])
				if err != nil || n <= 0 || n > 256 || n&(n-1) != 0 {
					return nil, i, fmt.Errorf("bad .align %.20q", toks[i+1])
				}
				p.Align, i = n, i+1
			case strings.HasPrefix(t, ".") && typeSize(t[1:]) > 0:
				p.Type = t[1:]
			case strings.HasPrefix(t, "."): // .ptr, state spaces: no effect on layout
			case t == "[" && i+2 < len(toks) && toks[i+2] == "]":
				n, err := strconv.Atoi(toks[i+1])
				if err != nil || n <= 0 || n > MaxParamBytes {
					return nil, i, fmt.Errorf("bad array length %.20q", toks[i+1])
				}
				p.Size, i = n, i+2
			case ptxIdent(t) && p.Name == "":
				p.Name = t
			default:
				return nil, i, fmt.Errorf("unexpected %.20q in a parameter", t)
			}
		}
		if p.Type == "" || p.Name == "" {
			return nil, i, fmt.Errorf("parameter %d lacks a type or a name", len(ps))
		}
		size := typeSize(p.Type)
		p.Size = max(p.Size, 1) * size
		if p.Align == 0 {
			p.Align = size
		}
		ps = append(ps, p)
		if len(ps) > MaxArgs {
			return nil, i, fmt.Errorf("more than %d parameters", MaxArgs)
		}
		if i < len(toks) && toks[i] == ")" {
			return ps, i, nil
		}
	}
	if i >= len(toks) {
		return nil, i, errors.New("unterminated parameter list")
	}
	return ps, i, nil
}

func ptxIdent(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		ok := r == '_' || r == '$' || r == '%' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9'
		if !ok {
			return false
		}
	}
	return true
}

// ptxTokens splits PTX into directives, identifiers, numbers and single
// punctuation characters, dropping comments and string literals.
func ptxTokens(text string) []string {
	var toks []string
	for i := 0; i < len(text); {
		c := text[i]
		switch {
		case strings.HasPrefix(text[i:], "//"):
			j := strings.IndexByte(text[i:], '\n')
			if j < 0 {
				return toks
			}
			i += j
		case strings.HasPrefix(text[i:], "/*"):
			j := strings.Index(text[i+2:], "*/")
			if j < 0 {
				return toks
			}
			i += j + 4
		case c == '"':
			j := strings.IndexByte(text[i+1:], '"')
			if j < 0 {
				return toks
			}
			i += j + 2
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '.' || c == '_' || c == '$' || c == '%' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(text) && (text[j] == '_' || text[j] == '$' || text[j] >= 'a' && text[j] <= 'z' || text[j] >= 'A' && text[j] <= 'Z' || text[j] >= '0' && text[j] <= '9') {
				j++
			}
			toks = append(toks, text[i:j])
			i = j
		default:
			toks = append(toks, text[i:i+1])
			i++
		}
	}
	return toks
}
