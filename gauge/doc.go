// Package gauge measures, from Postgres and at the moment it is asked, every
// figure an operator watches: the outbox's backlog age by state, its
// uncertain items (count and oldest), its quarantined items by reason, the
// webhook inbox's pending events, dead letters by reason, highest attempt
// count and oldest pending age, and the open reconciliation items by kind
// with the oldest one's age, and the domain events' dispatch backlog, dead
// letters and each consumer's dead letters and catch-up lag. Read returns them as one Snapshot; Collector
// exports a Snapshot as Prometheus gauges; `auroractl status` prints one.
//
// Rules it keeps:
//
//   - A figure it could not measure is an error, never a zero: Read returns
//     ErrQuery and Collector makes the whole scrape fail (HTTP 500 from
//     ops.Handler, `up == 0` in Prometheus), because no sample is better than
//     a wrong one.
//   - Ages are measured with the database clock (or an injected clock.Clock
//     in tests), never a replica's.
//   - Bounded cost: one read-only transaction per measurement, every
//     statement under statement_timeout (Config.QueryTimeoutMS), every query
//     served by a partial index whose size is the figure itself (near zero
//     when healthy), every count capped at Config.CountCap (a figure equal to
//     the cap reads "at least the cap"), and a measurement reused for
//     Config.MinIntervalMS so any number of scrapers costs one query set per
//     interval.
//
// One process exports these gauges: `aurora gauges`, one replica. The
// figures belong to the database, not to a replica: exported by every relay
// and deliverer they would cost the database once per replica and make sums
// across replicas count each item several times. A process of its own also
// keeps the meanings apart: its `up` says "the database could be measured",
// while each service's own `up` says that service is alive. A second
// replica is harmless (the same values; the alert rules aggregate with max),
// so a rolling restart needs no care.
package gauge
