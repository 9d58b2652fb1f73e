package agent

import (
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/vgpuha/vgpuha/hypervisor"
	"github.com/vgpuha/vgpuha/internal/cli"
)

// tenantFlags registers the limits that keep one guest (or tenant) from
// starving the others.
func tenantFlags(fs *flag.FlagSet, cfg *hypervisor.Config) {
	cli.SizeVar(fs, &cfg.RequestBufferBytes, "guest.request-buffer-bytes", cfg.RequestBufferBytes, 1<<20, cli.MaxInt64,
		"request bytes all guest connections may buffer together; a frame over it is refused")
	cli.SizeVar(fs, &cfg.ReplyQueueBytes, "guest.reply-queue-bytes", cfg.ReplyQueueBytes, 1<<20, cli.MaxInt64,
		"reply bytes one guest connection may hold queued for its guest (replies wait for the standby, or for the guest to read them); "+
			"past it the node reads none of that connection's requests until the guest reads its replies")
	cli.DurationVar(fs, &cfg.WriteTimeout, "guest.write-timeout", cfg.WriteTimeout, time.Second, 24*time.Hour,
		"longest a guest may take to read 1 MiB of its replies; one that reads nothing for this long is dropped and its session kept for its grace period")
	cli.SizeVar(fs, &cfg.ImageCacheBytes, "guest.image-cache-bytes", cfg.ImageCacheBytes, 0, cli.MaxInt64,
		"module images (cubins, fatbins) kept for the next process of the same tenant that loads them, named by hash instead of sent again (0: none); "+
			"shared out in --guest.image-cache-tenant-bytes shares")
	cli.SizeVar(fs, &cfg.ImageCacheTenantBytes, "guest.image-cache-tenant-bytes", cfg.ImageCacheTenantBytes, 0, cli.MaxInt64,
		"one tenant's share of --guest.image-cache-bytes: a tenant's images leave only for its own, never for another tenant's "+
			"(a new tenant takes the share of one that has no session left; 0: one share of it all)")
	cli.SizeVar(fs, &cfg.ImageUploadBytes, "guest.image-upload-bytes", cfg.ImageUploadBytes, 0, cli.MaxInt64,
		"module images too large for one request (over 15 MiB: cuRAND's, cuFFT's) that one tenant's sessions may upload in pieces at once, "+
			"held by the node until loaded; one image is at most 1 GiB")
	cli.DurationVar(fs, &cfg.MaxGrace, "guest.max-grace", cfg.MaxGrace, 0, 24*time.Hour,
		"longest a session is kept for its guest to resume after its connection drops (a guest may ask for less)")
	cli.SizeVar(fs, &cfg.TenantMemoryQuota, "tenant.memory-quota-bytes", cfg.TenantMemoryQuota, 1, cli.MaxUint64,
		"device memory all sessions of one tenant (vsock CID, local uid, remote IPv4 address or IPv6 /64) may allocate together; "+
			"allocations are first come, first served within the device's memory (quotas that sum to at most the device guarantee each tenant its own)")
	fs.BoolVar(&cfg.TenantOvercommit, "tenant.overcommit", false,
		"leave the device's memory to its own allocator; without it a new tenant is refused at its first session while the tenants present have allocated the whole device, "+
			"and an allocation that does not fit beside what they hold is refused (admission counts what tenants hold, never their quotas)")
	cli.IntVar(fs, &cfg.TenantMaxSessions, "tenant.max-sessions", cfg.TenantMaxSessions, 1, cli.MaxInt, "sessions one tenant may have open")
	cli.IntVar(fs, &cfg.TenantMaxDetached, "tenant.max-detached", cfg.TenantMaxDetached, 0, cli.MaxInt,
		"sessions one tenant may leave detached (kept for a resume); one more is freed when its connection drops")
	fs.Func("tenant.quota", "limits for one tenant, repeatable: ID=MEMORY,SESSIONS,DETACHED (ID: cid:N, uid:N or ip:ADDR, an IPv6 address naming its /64; MEMORY a size: 8GiB)", func(v string) error {
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
		return "", hypervisor.TenantQuota{}, fmt.Errorf("want ID=MEMORY,SESSIONS,DETACHED (MEMORY a size: 4GiB), got %q", v)
	}
	var q hypervisor.TenantQuota
	for _, field := range []struct {
		name, value string
		set         flag.Value
	}{
		{"MEMORY", f[0], cli.SizeValue(&q.Memory, 1, cli.MaxUint64)},
		{"SESSIONS", f[1], cli.IntValue(&q.Sessions, 1, cli.MaxInt)},
		{"DETACHED", f[2], cli.IntValue(&q.Detached, 0, cli.MaxInt)},
	} {
		if err := field.set.Set(field.value); err != nil {
			return "", q, fmt.Errorf("%s %s in %q: %w", field.name, field.value, v, err)
		}
	}
	return id, q, nil
}

// adminTokenFlag adds --admin.token-file.
func adminTokenFlag(fs *flag.FlagSet) *string {
	return fs.String("admin.token-file", "", "file holding the admin token: POST endpoints over tcp need it (Authorization: Bearer TOKEN), "+
		"and /status shows session ids and guest names only with it (a unix:// admin socket is trusted by its file permissions); "+
		"a node accepts every line of its file and reads it again on SIGHUP, a client sends the first line")
}
