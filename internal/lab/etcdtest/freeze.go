package etcdtest

import "syscall"

// FreezeAll stops every member (SIGSTOP): the cluster answers nobody and
// its clocks' time passes unseen until ThawAll.
func (p *Processes) FreezeAll() error { return p.signalAll(syscall.SIGSTOP) }

// ThawAll resumes every member (SIGCONT).
func (p *Processes) ThawAll() error { return p.signalAll(syscall.SIGCONT) }

func (p *Processes) signalAll(sig syscall.Signal) error {
	for _, c := range p.cmds {
		if err := c.Process.Signal(sig); err != nil {
			return err
		}
	}
	return nil
}
