package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/vgpuha/vgpuha/hypervisor"
)

// tenantFlags registers the limits that keep one guest (or tenant) from
// starving the others.
func tenantFlags(fs *flag.FlagSet, cfg *hypervisor.Config) {
	fs.Int64Var(&cfg.RequestBufferBytes, "guest.request-buffer-bytes", cfg.RequestBufferBytes,
		"request bytes all guest connections may buffer together; a frame over it is refused")
	fs.DurationVar(&cfg.MaxGrace, "guest.max-grace", cfg.MaxGrace,
		"longest a session is kept for its guest to resume after its connection drops (a guest may ask for less)")
	fs.Uint64Var(&cfg.TenantMemoryQuota, "tenant.memory-quota-bytes", cfg.TenantMemoryQuota,
		"device memory all sessions of one tenant (vsock CID, local uid, or remote IP) may allocate together")
	fs.IntVar(&cfg.TenantMaxSessions, "tenant.max-sessions", cfg.TenantMaxSessions, "sessions one tenant may have open")
	fs.IntVar(&cfg.TenantMaxDetached, "tenant.max-detached", cfg.TenantMaxDetached,
		"sessions one tenant may leave detached (kept for a resume); one more is freed when its connection drops")
	fs.Func("tenant.quota", "limits for one tenant, repeatable: ID=MEMORY_BYTES,SESSIONS,DETACHED (ID: cid:N, uid:N or ip:ADDR)", func(v string) error {
		id, q, err := parseTenantQuota(v)
		if err != nil {
			return err
		}
		if cfg.Tenants == nil {
			cfg.Tenants = map[string]hypervisor.TenantQuota{}
		}
		cfg.Tenants[id] = q
		return nil
	})
}

func parseTenantQuota(v string) (string, hypervisor.TenantQuota, error) {
	id, rest, ok := strings.Cut(v, "=")
	f := strings.Split(rest, ",")
	if !ok || id == "" || len(f) != 3 {
		return "", hypervisor.TenantQuota{}, fmt.Errorf("want ID=MEMORY_BYTES,SESSIONS,DETACHED, got %q", v)
	}
	mem, err1 := strconv.ParseUint(f[0], 0, 64)
	sessions, err2 := strconv.Atoi(f[1])
	detached, err3 := strconv.Atoi(f[2])
	if err1 != nil || err2 != nil || err3 != nil || sessions <= 0 || detached < 0 {
		return "", hypervisor.TenantQuota{}, fmt.Errorf("bad numbers in %q", v)
	}
	return id, hypervisor.TenantQuota{Memory: mem, Sessions: sessions, Detached: detached}, nil
}

// adminTokenFlag adds --admin.token-file.
func adminTokenFlag(fs *flag.FlagSet) *string {
	return fs.String("admin.token-file", "", "file holding the admin token: POST endpoints over tcp need it (Authorization: Bearer TOKEN), "+
		"and /status shows session ids and guest names only with it (a unix:// admin socket is trusted by its file permissions); "+
		"a node accepts every line of its file and reads it again on SIGHUP, a client sends the first line")
}
