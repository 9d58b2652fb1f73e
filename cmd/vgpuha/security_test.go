package main

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vgpuha/vgpuha/pvdriver"
)

// TestAdminToken: a primary started with --admin.token-file refuses
// mutating admin calls over tcp without the token (401, nothing runs),
// runs them with it (vgpuha verify presents it), and shows no session ids
// or guest names in /status without it.
func TestAdminToken(t *testing.T) {
	skipShort(t)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "admin-token")
	os.WriteFile(tokenFile, []byte("primary-admin-token-0123456789\n"), 0o600)
	sock, adminAddr := filepath.Join(dir, "g.sock"), freePort(t)
	startPrimary(t, "--guest-listen", "unix://"+sock, "--admin-listen", adminAddr, "--admin.token-file", tokenFile, "--backend", "sim")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	g, err := pvdriver.Open(ctx, "unix://"+sock, pvdriver.Options{GuestName: "alice-secret-name"})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()

	post := func(token string) int {
		req, _ := http.NewRequest(http.MethodPost, "http://"+adminAddr+"/epoch", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("POST /epoch without the token: %d", code)
	}
	if code := post("primary-admin-token-0123456789"); code != http.StatusConflict { // past the check: "does not replicate"
		t.Errorf("POST /epoch with the token: %d", code)
	}
	out, _ := exec.Command(vgpuhaBin, "verify", "--admin", adminAddr, "--admin.token-file", tokenFile).CombinedOutput()
	if !strings.Contains(string(out), "has no standby to verify against") { // past the token check
		t.Errorf("vgpuha verify with the token: %s", out)
	}
	resp, err := http.Get("http://" + adminAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Sessions []map[string]any
	}
	json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if len(st.Sessions) != 1 || st.Sessions[0]["id"] != nil || st.Sessions[0]["guest"] != nil {
		t.Fatalf("/status without the token: %+v", st.Sessions)
	}
}
