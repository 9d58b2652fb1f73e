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

func TestLoadToken(t *testing.T) {
	m, _, _ := node(t)
	short := filepath.Join(t.TempDir(), "short")
	writeFile(t, short, "abc\n")
	if err := m.LoadToken(short); err == nil {
		t.Fatal("a 3-byte token accepted")
	}
	good := filepath.Join(t.TempDir(), "good")
	writeFile(t, good, "  "+token+"\n")
	if err := m.LoadToken(good); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}
