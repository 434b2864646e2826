package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// The JetStream contract between the relay and the deliverers.
const (
	// StreamName is the JetStream stream that carries "this item is ready
	// for an attempt".
	StreamName = "AURORA_OUTBOX"
	// SubjectPrefix prefixes every outbox subject:
	// aurora.outbox.<exporter>.<tenant-token>.<partition> (PartitionSubject).
	SubjectPrefix = "aurora.outbox"
)

var rawTenantToken = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)

// TenantToken returns a subject-safe, stable token for tenant: the tenant
// itself when it matches [A-Za-z0-9][A-Za-z0-9_-]{0,63}, otherwise "~"
// followed by 24 hex characters of SHA-256(tenant). The two forms cannot
// collide ("~" never starts a raw token). Deliverer pools split by tenant
// filter on aurora.outbox.<exporter>.<token>.
func TenantToken(tenant string) string {
	if rawTenantToken.MatchString(tenant) {
		return tenant
	}
	sum := sha256.Sum256([]byte(tenant))
	return "~" + hex.EncodeToString(sum[:12])
}

// Subject returns aurora.outbox.<exporter>.<tenant-token>: the subject of
// tenant's items without the partition token (PartitionSubject adds it).
func Subject(exporter, tenant string) string {
	return SubjectPrefix + "." + TenantToken(exporter) + "." + TenantToken(tenant)
}

// MsgID returns the Nats-Msg-Id of an item's dispatch: the idempotency key,
// ".", the dispatch number. JetStream drops a republish of the same dispatch
// within its duplicate window but not a later dispatch.
func MsgID(key string, dispatch int32) string {
	return key + "." + strconv.FormatInt(int64(dispatch), 10)
}

// Message is the body of an outbox message. It names the row; the row in
// Postgres is the truth and carries everything else. Feature and Lane are
// routing hints only: Lane (see Lane) is the (account, customer, meter) the
// relay read when it published, and a deliverer runs one lane's messages one
// at a time; they may be empty and are never trusted over the row.
type Message struct {
	ItemID   int64  `json:"item_id"`
	Key      string `json:"key"`
	Dispatch int32  `json:"dispatch"`
	Feature  string `json:"feature,omitempty"`
	Lane     string `json:"lane,omitempty"`
}

// ErrBadMessage: a message body that is not a valid Message.
var ErrBadMessage = errors.New("outbox: bad message")

// Encode returns the JSON body.
func (m Message) Encode() []byte {
	b, _ := json.Marshal(m) // cannot fail: plain fields
	return b
}

// DecodeMessage parses a body; a malformed one returns ErrBadMessage.
func DecodeMessage(b []byte) (Message, error) {
	var m Message
	if err := json.Unmarshal(b, &m); err != nil {
		return Message{}, fmt.Errorf("%w: %v", ErrBadMessage, err)
	}
	if m.ItemID <= 0 || len(m.Key) != 64 || m.Dispatch < 1 {
		return Message{}, fmt.Errorf("%w: item_id, key and dispatch are required", ErrBadMessage)
	}
	return m, nil
}
