package standby

// Public is the standby's status for an admin caller without the token:
// the replica's sessions without ids, guest names or tenants.
func (s Status) Public() any {
	s.Replica = s.Replica.Redacted()
	return s
}
