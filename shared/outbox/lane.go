package outbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
)

// A lane is what Stripe serialises: one (destination account, Stripe
// customer, meter). Stripe allows one concurrent meter event call per
// customer and meter, so a lane has one owner at a time: the relay publishes
// every message of a lane on one partition, and each partition is consumed
// by one deliverer at a time (a JetStream priority group with the pinned
// client policy; docs/deliverer.md).

// PartitionsDefault is the number of partitions of AURORA_OUTBOX unless the
// relay is configured otherwise (AURORA_OUTBOX_PARTITIONS). The relay writes
// the number into the stream's metadata (MetaPartitions); deliverers read it
// from there, so the two cannot disagree.
const PartitionsDefault = 16

// Stream metadata keys the relay writes and the deliverers read.
const (
	// MetaPartitions: the number of partitions, decimal.
	MetaPartitions = "aurora_partitions"
	// MetaDatabase: the DatabaseID of the outbox whose relay created the
	// stream.
	MetaDatabase = "aurora_outbox_database"
)

// HeaderDatabase is the message header naming the DatabaseID of the outbox
// that staged the item (the relay sets it on every message).
const HeaderDatabase = "Aurora-Outbox-Database"

// Lane returns the lane token of (account, customer, meter): 16 lowercase
// hex characters of SHA-256 over the length-prefixed parts. It names no
// customer (it is published in message bodies). An item whose customer or
// meter is not known yet gets the lane of (account, "tenant:"+tenant,
// "feature:"+feature): UnmappedLane.
func Lane(account, customer, meter string) string {
	h := sha256.New()
	for _, p := range []string{account, customer, meter} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(p)))
		h.Write(n[:])
		h.Write([]byte(p))
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// UnmappedLane is the lane of an item whose tenant has no Stripe customer or
// whose feature has no meter on account (it will be quarantined by the
// pre-send checks; a lane of its own keeps it off the mapped lanes).
func UnmappedLane(account, tenant, feature string) string {
	return Lane(account, "tenant:"+tenant, "feature:"+feature)
}

// Partition returns the partition, in [0, n), of lane (a Lane token): its
// first 8 bytes as a big-endian number modulo n. A lane that does not parse
// goes to partition 0. n < 1 is taken as 1.
func Partition(lane string, n int) int {
	if n < 1 {
		return 0
	}
	b, err := hex.DecodeString(lane)
	if err != nil || len(b) < 8 {
		return 0
	}
	return int(binary.BigEndian.Uint64(b[:8]) % uint64(n))
}

// PartitionSubject returns the subject a message of tenant's item on
// partition p is published on: aurora.outbox.<exporter>.<tenant-token>.<p>.
// Pools still split by tenant (the fourth token); the fifth picks the
// partition consumer.
func PartitionSubject(exporter, tenant string, p int) string {
	return Subject(exporter, tenant) + "." + strconv.Itoa(p)
}
