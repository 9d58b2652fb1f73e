// Package admin serves a node's operator endpoints: /metrics (Prometheus
// text from the node's own registry), /healthz, and /status (JSON from the
// node's status function), /debug/pprof/ (Go's profiles, for trusted
// callers only: a profile names the code and costs CPU while it runs), plus
// whatever the node adds (POST /verify, /switchover, /epoch on a primary).
// It renders; it owns no state.
//
// Every endpoint goes through Mux, which is where the admin port's trust
// boundary lies (any local process, and any web page a local browser
// opens, can reach a TCP port):
//   - a caller is trusted if it came over a unix socket (the socket file's
//     permissions are the credential; the node creates it 0600) or presents
//     one of the node's admin tokens as "Authorization: Bearer TOKEN",
//     compared in constant time (a token file holds one token a line, so a
//     new token can be added, clients moved to it and the old one removed,
//     each step loaded again by LoadToken without a restart);
//   - a request that may change something (any method but GET, HEAD,
//     OPTIONS) from an untrusted caller gets 401 and reaches no handler;
//   - a browser's cross-site request that may change something gets 403
//     (http.CrossOriginProtection: Sec-Fetch-Site, then Origin against
//     Host), token or not;
//   - /status to an untrusted caller is the status's Public() form: no
//     session ids, guest names or tenants (a status without Public shows
//     nothing but that it needs the token);
//   - every refusal is logged and counted in vgpuha_admin_refusals_total.
package admin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MinTokenBytes is the shortest admin token accepted.
const MinTokenBytes = 16

// Registry is a node's metrics registry.
type Registry interface {
	prometheus.Gatherer
	prometheus.Registerer
}

// Public is a status that has a form for untrusted callers.
type Public interface {
	Public() any
}

// Mux is the admin handler: a ServeMux behind the checks in the package
// doc.
type Mux struct {
	mux     *http.ServeMux
	cop     *http.CrossOriginProtection
	tokens  atomic.Pointer[[][sha256.Size]byte] // nil or empty: only unix-socket callers are trusted
	log     *slog.Logger
	refused *prometheus.CounterVec
	health  func() error // nil: always healthy
}

// SetHealth makes /healthz answer 503 with health's error while it
// returns one (a fenced node, say).
func (m *Mux) SetHealth(health func() error) { m.health = health }

type trustKey struct{}

// Handler returns the admin mux. status is called for every /status
// request. A refusal counter is registered on reg.
func Handler(reg Registry, status func() any) *Mux {
	m := &Mux{
		mux: http.NewServeMux(),
		cop: http.NewCrossOriginProtection(),
		log: slog.Default(),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vgpuha_admin_refusals_total",
			Help: "Admin requests refused, by reason: token (a mutating call without the admin token), cross_site (a browser's cross-site request).",
		}, []string{"reason"}),
	}
	m.refused.WithLabelValues("token")
	m.refused.WithLabelValues("cross_site")
	reg.MustRegister(m.refused)
	m.mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if m.health != nil {
			if err := m.health(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.Write([]byte("ok\n"))
	})
	m.mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		v := status()
		if !Trusted(r) {
			if p, ok := v.(Public); ok {
				v = p.Public()
			} else {
				v = map[string]string{"detail": "status needs the admin token"}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(v)
	})
	m.mux.Handle("GET /debug/pprof/", trustedOnly(http.HandlerFunc(pprof.Index)))
	for name, h := range map[string]http.HandlerFunc{
		"cmdline": pprof.Cmdline, "profile": pprof.Profile, "symbol": pprof.Symbol, "trace": pprof.Trace,
	} {
		m.mux.Handle("GET /debug/pprof/"+name, trustedOnly(h))
	}
	return m
}

// trustedOnly answers 401 to an untrusted caller instead of running h.
func trustedOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Trusted(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vgpuha admin"`)
			http.Error(w, "profiles need the node's admin token or a unix:// admin socket", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// Handle registers a handler (see http.ServeMux).
func (m *Mux) Handle(pattern string, h http.Handler) { m.mux.Handle(pattern, h) }

// HandleFunc registers a handler function (see http.ServeMux).
func (m *Mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.mux.HandleFunc(pattern, h)
}

// SetLogger sets where refusals are logged.
func (m *Mux) SetLogger(log *slog.Logger) { m.log = log }

// SetToken sets the admin tokens a caller may present (any of them); none
// trusts unix-socket callers only. Safe while requests are served.
func (m *Mux) SetToken(tokens ...[]byte) {
	sums := make([][sha256.Size]byte, len(tokens))
	for i, t := range tokens {
		sums[i] = sha256.Sum256(t)
	}
	m.tokens.Store(&sums)
}

// LoadToken reads the admin tokens from a file, one a line (surrounding
// white space and empty lines are ignored), and returns how many it took;
// an empty path sets none. On an error the tokens in use stay.
func (m *Mux) LoadToken(path string) (int, error) {
	if path == "" {
		m.SetToken()
		return 0, nil
	}
	tokens, err := ReadTokens(path)
	if err != nil {
		return 0, err
	}
	m.SetToken(tokens...)
	return len(tokens), nil
}

// ReadTokens reads a token file: one token a line, each at least
// MinTokenBytes. A client presents the first.
func ReadTokens(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the admin token: %w", err)
	}
	var tokens [][]byte
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if line = bytes.TrimSpace(line); len(line) == 0 {
			continue
		}
		if len(line) < MinTokenBytes {
			return nil, fmt.Errorf("admin token in %s (line %d) is %d bytes; need at least %d (try: head -c 32 /dev/urandom | base64 > %s)",
				path, len(tokens)+1, len(line), MinTokenBytes, path)
		}
		tokens = append(tokens, line)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("admin token file %s is empty (try: head -c 32 /dev/urandom | base64 > %s)", path, path)
	}
	return tokens, nil
}

// ServeHTTP implements http.Handler.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := m.cop.Check(r); err != nil {
		m.refuse(w, r, "cross_site", http.StatusForbidden, "cross-site request refused")
		return
	}
	trusted := m.trusted(r)
	if !trusted && !safe(r.Method) {
		w.Header().Set("WWW-Authenticate", `Bearer realm="vgpuha admin"`)
		m.refuse(w, r, "token", http.StatusUnauthorized,
			"this call needs the node's admin token (Authorization: Bearer TOKEN; --admin.token-file) or a unix:// admin socket")
		return
	}
	m.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), trustKey{}, trusted)))
}

func (m *Mux) refuse(w http.ResponseWriter, r *http.Request, reason string, code int, msg string) {
	m.refused.WithLabelValues(reason).Inc()
	m.log.Warn("admin request refused", "reason", reason, "method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr,
		"origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
	http.Error(w, msg, code)
}

// Trusted reports whether a request reaching a handler came from a trusted
// caller.
func Trusted(r *http.Request) bool {
	t, _ := r.Context().Value(trustKey{}).(bool)
	return t
}

func (m *Mux) trusted(r *http.Request) bool {
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la.Network() == "unix" {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	tokens := m.tokens.Load()
	if !ok || tokens == nil {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
	match := 0
	for _, t := range *tokens {
		match |= subtle.ConstantTimeCompare(sum[:], t[:])
	}
	return match == 1
}

func safe(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}
