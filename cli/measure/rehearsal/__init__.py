"""The rehearsals: the system under load with two replicas of everything, losing its parts,
and an audit of every conversation's log afterwards. `concierge cluster-rehearsal`
(cluster_rehearsal.py: three clustered nats-servers, one process killed at a time) and
`concierge chaos` (chaos.py: one nats-server, one fault at a time). What they share, the
system they start, its visitors and the audit, is cluster.py."""
