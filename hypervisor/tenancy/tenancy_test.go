package tenancy

import (
	"net"
	"testing"
)

// TestIPTenants: an IPv4 address is its own tenant (mapped into IPv6 or
// not), an IPv6 address its /64 prefix, and a configured ID with any
// address or prefix of a /64 names that /64.
func TestIPTenants(t *testing.T) {
	for _, c := range []struct{ ip, want string }{
		{"10.0.0.5", "ip:10.0.0.5"},
		{"::ffff:10.0.0.5", "ip:10.0.0.5"},
		{"2001:db8:1:2::1", "ip:2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", "ip:2001:db8:1:2::/64"},
		{"2001:db8:1:3::1", "ip:2001:db8:1:3::/64"},
		{"::1", "ip:::/64"},
		{"fe80::1", "ip:fe80::/64"},
	} {
		if got := OfIP(net.ParseIP(c.ip)); got != c.want {
			t.Errorf("OfIP(%s) = %s, want %s", c.ip, got, c.want)
		}
	}
	for id, want := range map[string]string{
		"ip:2001:db8:1:2::77":     "ip:2001:db8:1:2::/64",
		"ip:2001:db8:1:2::/64":    "ip:2001:db8:1:2::/64",
		"ip:2001:db8:1:2:5::/80":  "ip:2001:db8:1:2::/64",
		"ip:10.0.0.5":             "ip:10.0.0.5",
		"uid:1000":                "uid:1000",
		"cid:3":                   "cid:3",
		"ip:not-an-address":       "ip:not-an-address",
		"ip:2001:db8:1:2::1%eth0": "ip:2001:db8:1:2::1%eth0",
	} {
		if got := Canonical(id); got != want {
			t.Errorf("Canonical(%s) = %s, want %s", id, got, want)
		}
	}
}

// TestAdmissionCountsHeldBytes: tenants that hold nothing keep nobody
// out, whatever their quotas; a tenant is refused only while the device is
// all held, an allocation only when it does not fit beside what is held.
func TestAdmissionCountsHeldBytes(t *testing.T) {
	r := NewRegistry(Config{Default: Quota{Memory: 6 << 30, Sessions: 4}, DeviceMemory: 8 << 30})
	var idle []*Tenant
	for _, id := range []string{"uid:1", "uid:2", "uid:3", "uid:4"} {
		ten, err := r.Admit(id) // 24 GiB of quotas on an 8 GiB device
		if err != nil {
			t.Fatalf("%s, with nothing held: %v", id, err)
		}
		ten.Sessions++
		idle = append(idle, ten)
	}
	if err := idle[0].Reserve(6 << 30); err != nil {
		t.Fatal(err)
	}
	if err := idle[1].Reserve(3 << 30); err == nil {
		t.Fatal("9 GiB held on an 8 GiB device")
	}
	if err := idle[1].Reserve(2 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Admit("uid:5"); err == nil {
		t.Fatal("a tenant admitted while the device is all held")
	}
	if _, err := r.Admit("uid:1"); err != nil {
		t.Fatalf("a tenant present, while the device is all held: %v", err)
	}
	idle[0].Release(1 << 30)
	if _, err := r.Admit("uid:5"); err != nil {
		t.Fatalf("after 1 GiB was freed: %v", err)
	}
	if st := r.Status(); st.UsedBytes != 7<<30 || st.DeviceMemoryBytes != 8<<30 || len(st.Tenants) != 5 {
		t.Errorf("status: %+v", st)
	}
	idle[1].Release(1 << 40) // more than it holds: counts it all back, no more
	if st := r.Status(); st.UsedBytes != 5<<30 {
		t.Errorf("after an over-release: %d bytes held, want 5 GiB", st.UsedBytes)
	}

	over := NewRegistry(Config{Default: Quota{Memory: 1 << 62}, Overcommit: true, DeviceMemory: 1 << 30})
	a, _ := over.Admit("uid:1")
	if err := a.Reserve(4 << 30); err != nil {
		t.Fatalf("overcommit: %v", err)
	}
	if _, err := over.Admit("uid:2"); err != nil {
		t.Fatalf("overcommit: %v", err)
	}
	if err := a.Reserve(1<<62 - 4<<30 + 1); err == nil {
		t.Fatal("past the tenant's quota")
	}
}
