package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
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
	if err := m.Validate(); err != nil {
		return Message{}, err
	}
	return m, nil
}

// Validate checks what a deliverer needs of a message: an item id above 0,
// a 64-character key and a dispatch of at least 1 (ErrBadMessage
// otherwise).
func (m Message) Validate() error {
	if m.ItemID <= 0 || len(m.Key) != 64 || m.Dispatch < 1 {
		return fmt.Errorf("%w: item_id, key and dispatch are required", ErrBadMessage)
	}
	return nil
}

// HeaderBatch marks a batch message: its body is a Batch (several items of
// one partition in one JetStream message) instead of one Message; the
// value is the number of items. Deliverers of this build accept both kinds
// and say so in their consumers' metadata (MetaBatchMessages); a relay
// sends batches (AURORA_RELAY_BATCH_MESSAGE_ITEMS above 1, on
// BatchSubject) only to subjects such a consumer filters, since an older
// deliverer terminates a batch body as a bad message (its items then wait
// for the relay's re-dispatch sweep).
const HeaderBatch = "Aurora-Outbox-Batch"

// BatchEntry is one item of a Batch: the subject its own message would
// have (aurora.outbox.<exporter>.<tenant-token>.<partition>; the deliverer
// keys the item's lane from it) and the item's Message.
type BatchEntry struct {
	Subject string `json:"subject"`
	Message
}

// Batch is the body of a batch message (HeaderBatch).
type Batch struct {
	Items []BatchEntry `json:"items"`
}

// Encode returns the JSON body.
func (b Batch) Encode() []byte {
	out, _ := json.Marshal(b) // cannot fail: plain fields
	return out
}

// DecodeBatch parses a batch body: ErrBadMessage when it is not JSON of a
// Batch or holds no item. Entries are not validated here: a deliverer
// checks each (BatchEntry.Validate) and sets aside only the bad ones.
func DecodeBatch(b []byte) (Batch, error) {
	var out Batch
	if err := json.Unmarshal(b, &out); err != nil {
		return Batch{}, fmt.Errorf("%w: batch: %v", ErrBadMessage, err)
	}
	if len(out.Items) == 0 {
		return Batch{}, fmt.Errorf("%w: batch without items", ErrBadMessage)
	}
	return out, nil
}

// Validate checks the entry's message (Message.Validate) and that it names
// an outbox subject (ErrBadMessage otherwise).
func (e BatchEntry) Validate() error {
	if !strings.HasPrefix(e.Subject, SubjectPrefix+".") {
		return fmt.Errorf("%w: batch entry without an outbox subject", ErrBadMessage)
	}
	return e.Message.Validate()
}

// BatchMsgID returns the Nats-Msg-Id of a batch: "batch." and the
// lowercase hex SHA-256 of its items' MsgIDs in order, one per line. A
// republish of the same items at the same dispatches in the same order is
// dropped by JetStream within its duplicate window; any other composition
// is a new message, whose items the deliverers' claims find already
// handled.
func BatchMsgID(b Batch) string {
	h := sha256.New()
	for _, e := range b.Items {
		h.Write([]byte(MsgID(e.Key, e.Dispatch)))
		h.Write([]byte{'\n'})
	}
	return "batch." + hex.EncodeToString(h.Sum(nil))
}

// BatchToken stands in the tenant position of a batch message's subject:
// aurora.outbox.<exporter>._batch.<partition> (BatchSubject). No tenant
// token can be it (a raw token starts with a letter or digit, a hashed one
// with "~"), so a pool that filters by tenant never matches a batch; a pool
// whose filter has "*" there does.
const BatchToken = "_batch"

// BatchSubject returns the subject of a batch message of exporter's items
// on partition p.
func BatchSubject(exporter string, p int) string {
	return SubjectPrefix + "." + TenantToken(exporter) + "." + BatchToken + "." + strconv.Itoa(p)
}

// MetaBatchMessages is the consumer metadata key ("1") by which a
// deliverer's partition consumer says its deliverers accept batch messages.
// A relay sends a batch only to a subject such a consumer filters: never to
// a pool of older deliverers, or to subjects no pool takes as a whole.
const MetaBatchMessages = "aurora_batch_messages"

// SubjectMatches reports whether subject is matched by filter, NATS style:
// tokens split on ".", "*" matches one token, a final ">" one or more.
func SubjectMatches(filter, subject string) bool {
	fs, ss := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, f := range fs {
		if f == ">" {
			return i == len(fs)-1 && len(ss) > i
		}
		if i >= len(ss) || (f != "*" && f != ss[i]) {
			return false
		}
	}
	return len(fs) == len(ss)
}
