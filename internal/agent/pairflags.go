package agent

import (
	"flag"

	"github.com/vgpuha/vgpuha/internal/cli"
	"github.com/vgpuha/vgpuha/internal/node"
	"github.com/vgpuha/vgpuha/replicate/admission"
)

// pairFlags name the pair a node belongs to and which primaries a standby
// follows (package replicate/admission; docs/OPERATIONS.md, "Which primary a
// standby follows").
type pairFlags struct {
	group string
	adopt bool
}

// register adds --group, and on a standby --adopt.
func (p *pairFlags) register(fs *flag.FlagSet, standby bool) {
	if !standby {
		cli.StringVar(fs, &p.group, "group", "", admission.CheckGroup, "names this pair: its standbys follow only primaries of this group (empty: this primary's id, which the standby that takes over carries on; under --coordinator, the coordinator's group)")
		return
	}
	cli.StringVar(fs, &p.group, "group", "", admission.CheckGroup, "the pair this standby protects: it follows only primaries of this --group (empty: the first primary to connect, then that pair's successors; under --coordinator, the coordinator's group)")
	fs.BoolVar(&p.adopt, "adopt", false, "follow the first primary that connects whatever its group, replacing this standby's replica (once); without it a standby that follows a pair refuses every other primary")
}

// apply sets them in a node's configuration.
func (p *pairFlags) apply(ncfg *node.Config) { ncfg.Group, ncfg.Adopt = p.group, p.adopt }
