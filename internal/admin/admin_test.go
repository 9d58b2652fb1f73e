package admin

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

type fakeStatus struct {
	Sessions []string `json:"sessions"`
}

func (s fakeStatus) Public() any { return fakeStatus{Sessions: []string{"hidden"}} }

const token = "test-admin-token-0123456789"

// node is an admin mux like a primary's: a status with sessions and a
// mutating endpoint that counts its calls.
func node(t *testing.T) (*Mux, *prometheus.Registry, *atomic.Int64) {
	reg := prometheus.NewRegistry()
	m := Handler(reg, func() any { return fakeStatus{Sessions: []string{"session 1: guest alice"}} })
	var changed atomic.Int64
	m.HandleFunc("POST /switchover", func(w http.ResponseWriter, r *http.Request) { changed.Add(1) })
	m.SetToken([]byte(token))
	m.SetLogger(slog.New(slog.NewTextHandler(io.Discard, nil)))
	return m, reg, &changed
}

func do(t *testing.T, base, method, path string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, base+path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestMutatingCallsNeedToken: over tcp, a POST without the token (or with a
// wrong one, or cross-site with the right one) is refused before any
// handler runs, and counted; with the token it runs.
func TestMutatingCallsNeedToken(t *testing.T) {
	m, reg, changed := node(t)
	srv := httptest.NewServer(m)
	defer srv.Close()
	bearer := map[string]string{"Authorization": "Bearer " + token}
	cases := []struct {
		name string
		hdr  map[string]string
		want int
	}{
		{"no token", nil, http.StatusUnauthorized},
		{"wrong token", map[string]string{"Authorization": "Bearer " + token + "x"}, http.StatusUnauthorized},
		{"basic auth", map[string]string{"Authorization": "Basic " + token}, http.StatusUnauthorized},
		{"cross-site with the token", map[string]string{"Authorization": "Bearer " + token, "Sec-Fetch-Site": "cross-site"}, http.StatusForbidden},
		{"foreign origin with the token", map[string]string{"Authorization": "Bearer " + token, "Origin": "http://evil.example"}, http.StatusForbidden},
	}
	for _, tc := range cases {
		if code, _ := do(t, srv.URL, http.MethodPost, "/switchover", tc.hdr); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
	}
	if n := changed.Load(); n != 0 {
		t.Fatalf("refused calls ran the handler %d times", n)
	}
	if code, _ := do(t, srv.URL, http.MethodPost, "/switchover", bearer); code != http.StatusOK || changed.Load() != 1 {
		t.Fatalf("with the token: %d, handler ran %d times", code, changed.Load())
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("token")); got != 3 {
		t.Errorf("%v token refusals counted, want 3", got)
	}
	if got := testutil.ToFloat64(m.refused.WithLabelValues("cross_site")); got != 2 {
		t.Errorf("%v cross-site refusals counted, want 2", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Errorf("metrics lint: %v %v", problems, err)
	}
}

// TestStatusHidesSessionsWithoutToken: /status shows the Public form to a
// caller without the token, everything to one with it.
func TestStatusHidesSessionsWithoutToken(t *testing.T) {
	m, _, _ := node(t)
	srv := httptest.NewServer(m)
	defer srv.Close()
	if code, body := do(t, srv.URL, http.MethodGet, "/status", nil); code != 200 || strings.Contains(body, "alice") || !strings.Contains(body, "hidden") {
		t.Fatalf("status without the token: %d %s", code, body)
	}
	if _, body := do(t, srv.URL, http.MethodGet, "/status", map[string]string{"Authorization": "Bearer " + token}); !strings.Contains(body, "alice") {
		t.Fatalf("status with the token: %s", body)
	}
	bare := Handler(prometheus.NewRegistry(), func() any { return map[string]string{"guest": "alice"} })
	srv2 := httptest.NewServer(bare)
	defer srv2.Close()
	if _, body := do(t, srv2.URL, http.MethodGet, "/status", nil); strings.Contains(body, "alice") {
		t.Fatalf("a status with no public form leaked: %s", body)
	}
}

// TestUnixSocketTrusted: over a unix socket (whose file permissions guard
// it) no token is needed.
func TestUnixSocketTrusted(t *testing.T) {
	m, _, changed := node(t)
	sock := filepath.Join(t.TempDir(), "admin.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: m}
	go srv.Serve(ln)
	defer srv.Close()
	c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	resp, err := c.Post("http://admin/switchover", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || changed.Load() != 1 {
		t.Fatalf("unix-socket POST: %s, handler ran %d times", resp.Status, changed.Load())
	}
	resp, err = c.Get("http://admin/status")
	if err != nil {
		t.Fatal(err)
	}
	var st fakeStatus
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if len(st.Sessions) != 1 || !strings.Contains(st.Sessions[0], "alice") {
		t.Fatalf("unix-socket status: %+v", st)
	}
}

// TestLoadToken: a token file holds one token a line; every one is
// accepted, a reload replaces them while requests are served, and a bad
// file leaves the tokens in use.
func TestLoadToken(t *testing.T) {
	m, _, changed := node(t)
	srv := httptest.NewServer(m)
	defer srv.Close()
	dir := t.TempDir()
	for _, bad := range []string{"abc\n", token + "\nabc\n", "\n \n"} {
		path := filepath.Join(dir, "bad")
		writeFile(t, path, bad)
		if _, err := m.LoadToken(path); err == nil {
			t.Fatalf("token file %q accepted", bad)
		}
	}
	post := func(tok string) int {
		code, _ := do(t, srv.URL, http.MethodPost, "/switchover", map[string]string{"Authorization": "Bearer " + tok})
		return code
	}
	if post(token) != http.StatusOK {
		t.Fatal("a failed load dropped the token in use")
	}
	const second = "the-next-admin-token-0123456789"
	path := filepath.Join(dir, "tokens")
	writeFile(t, path, "  "+token+"\n\n"+second+"\n")
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // requests while the tokens are replaced (go test -race)
		defer wg.Done()
		for range 50 {
			post(token)
		}
	}()
	if n, err := m.LoadToken(path); err != nil || n != 2 {
		t.Fatalf("two tokens: %d, %v", n, err)
	}
	wg.Wait()
	if post(token) != http.StatusOK || post(second) != http.StatusOK {
		t.Fatal("one of two tokens refused")
	}
	writeFile(t, path, second+"\n")
	if n, err := m.LoadToken(path); err != nil || n != 1 {
		t.Fatalf("one token: %d, %v", n, err)
	}
	before := changed.Load()
	if post(token) != http.StatusUnauthorized || post(second) != http.StatusOK || changed.Load() != before+1 {
		t.Fatal("the removed token still works, or the kept one does not")
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestProfilesNeedTrust: over tcp, Go's profiles answer only a caller with
// the token; the index and a heap profile come back to one that has it.
func TestProfilesNeedTrust(t *testing.T) {
	m, _, _ := node(t)
	srv := httptest.NewServer(m)
	defer srv.Close()
	bearer := map[string]string{"Authorization": "Bearer " + token}
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/cmdline", "/debug/pprof/profile?seconds=1"} {
		if code, _ := do(t, srv.URL, http.MethodGet, path, nil); code != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", path, code)
		}
	}
	if code, body := do(t, srv.URL, http.MethodGet, "/debug/pprof/", bearer); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("index with the token: %d %q", code, body)
	}
	if code, body := do(t, srv.URL, http.MethodGet, "/debug/pprof/heap", bearer); code != http.StatusOK || len(body) == 0 {
		t.Errorf("heap profile with the token: %d, %d bytes", code, len(body))
	}
}
