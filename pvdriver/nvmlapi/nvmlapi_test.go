package nvmlapi

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestCHalfAgrees: the C half (pvdriver/libnvml) defines exactly the
// entries this table serves (plus its own: nvmlErrorString's texts and
// nvidia-smi's private table, cOnly), and lists none of them among those
// it does not serve.
func TestCHalfAgrees(t *testing.T) {
	src, err := os.ReadFile("../libnvml/nvml.c")
	if err != nil {
		t.Fatal(err)
	}
	unserved, err := os.ReadFile("../libnvml/unserved.h")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, re := range []string{`(?m)^nvmlReturn_t (nvml\w+)\(`, `(?m)^(?:UINT_ENTRY|UINT_ARG_ENTRY|ULL_ENTRY|PROCESS_ENTRY)\((nvml\w+)`} {
		for _, m := range regexp.MustCompile(re).FindAllStringSubmatch(string(src), -1) {
			defined[m[1]] = true
		}
	}
	for _, name := range Names() {
		if !defined[name] {
			t.Errorf("%s is served here but nvml.c does not define it", name)
		}
	}
	var extra []string
	for name := range defined {
		if !Served(name) && !cOnly[name] {
			extra = append(extra, name)
		}
	}
	sort.Strings(extra)
	if len(extra) > 0 {
		t.Errorf("nvml.c defines entries this table does not serve: %s", strings.Join(extra, ", "))
	}
	for _, m := range regexp.MustCompile(`UNSERVED\((\w+)\)`).FindAllStringSubmatch(string(unserved), -1) {
		if Served(m[1]) || defined[m[1]] {
			t.Errorf("%s is listed as not served, but is", m[1])
		}
	}
}

// cOnly are the entries the C half answers alone.
var cOnly = map[string]bool{"nvmlInternalGetExportTable": true}

func TestParseBusID(t *testing.T) {
	for _, c := range []struct {
		in            string
		dom, bus, dev uint64
		ok            bool
	}{
		{"00000000:1B:00.0", 0, 0x1b, 0, true},
		{"0000:1b:00.0", 0, 0x1b, 0, true},
		{"1b:02.0", 0, 0x1b, 2, true},
		{" 0001:C3:1F.0 ", 1, 0xc3, 0x1f, true},
		{"1b:00", 0, 0, 0, false},
		{"0000:1b:zz.0", 0, 0, 0, false},
		{"0:0:0:0.0", 0, 0, 0, false},
		{"", 0, 0, 0, false},
	} {
		dom, bus, dev, ok := ParseBusID(c.in)
		if ok != c.ok || (ok && (dom != c.dom || bus != c.bus || dev != c.dev)) {
			t.Errorf("ParseBusID(%q) = %x %x %x %v, want %x %x %x %v", c.in, dom, bus, dev, ok, c.dom, c.bus, c.dev, c.ok)
		}
	}
}

// TestUnserved: an entry not in the table answers NOT_SUPPORTED and, with
// a debug writer, names itself once.
func TestUnserved(t *testing.T) {
	var b strings.Builder
	a := New(nil, &b)
	for range 2 {
		if r := a.Call("nvmlDeviceGetTotalEnergyConsumption", Request{}, &Answer{}); r != ErrorNotSupported {
			t.Fatalf("unserved entry: %d", r)
		}
	}
	if got := strings.Count(b.String(), "nvmlDeviceGetTotalEnergyConsumption is not supported"); got != 1 {
		t.Errorf("named itself %d times:\n%s", got, b.String())
	}
	if r := a.Call("nvmlDeviceGetCount_v2", Request{}, &Answer{}); r != ErrorUninitialized {
		t.Errorf("a served entry before nvmlInit: %d", r)
	}
}
