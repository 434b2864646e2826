package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/aurora-billing/aurora/inbox"
	"github.com/aurora-billing/aurora/shared/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Default accounts: seed 004's transfer chart of accounts (debit 1010 /
// credit 2010).
const (
	DefaultDebitAccount  = "1010"
	DefaultCreditAccount = "2010"
)

var (
	// ErrInvalidChart: an account code is malformed, or debit and credit
	// are the same account.
	ErrInvalidChart = errors.New("ledger: invalid chart of accounts")
	// ErrInvalidPayload: an InvoicePaid.v1 payload the ledger cannot post
	// (no amount, no currency, not JSON). The handler fails: the event is
	// retried and, after its budget, dead-lettered for this consumer, where
	// an operator sees it (`auroractl events list --dead-letter`); it is
	// never dropped silently.
	ErrInvalidPayload = errors.New("ledger: invalid InvoicePaid.v1 payload")
)

var accountPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,31}$`)

// ChartOfAccounts names the accounts an InvoicePaid.v1 posts to: the
// amount is debited to Debit (cash, 1010) and credited to Credit
// (receivables, 2010).
type ChartOfAccounts struct {
	Debit  string `json:"debit"`
	Credit string `json:"credit"`
}

// DefaultChart is debit 1010 / credit 2010.
func DefaultChart() ChartOfAccounts {
	return ChartOfAccounts{Debit: DefaultDebitAccount, Credit: DefaultCreditAccount}
}

// Validate returns ErrInvalidChart for an account that is not 1..32 of
// A-Z a-z 0-9 . _ - (starting with a letter or digit), or debit = credit.
func (c ChartOfAccounts) Validate() error {
	for _, a := range []struct{ side, code string }{{"debit", c.Debit}, {"credit", c.Credit}} {
		if !accountPattern.MatchString(a.code) {
			return fmt.Errorf("%w: %s account must be 1..32 of A-Z a-z 0-9 . _ -", ErrInvalidChart, a.side)
		}
	}
	if c.Debit == c.Credit {
		return fmt.Errorf("%w: debit and credit are the same account %s", ErrInvalidChart, c.Debit)
	}
	return nil
}

// Schema is the ledger's own tables, in the events database (the handler
// writes them in the transaction of its inbox claim). One journal entry per
// event (the primary key is a second guard behind the inbox), two lines per
// entry that balance by construction.
const Schema = `
CREATE TABLE IF NOT EXISTS ledger_entries (
    event_id    uuid PRIMARY KEY,
    invoice_id  text NOT NULL,
    tenant      text NOT NULL,
    currency    text NOT NULL CHECK (currency ~ '^[a-z]{3}$'),
    amount      bigint NOT NULL CHECK (amount > 0),
    posted_at   timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS ledger_lines (
    event_id  uuid NOT NULL REFERENCES ledger_entries (event_id),
    side      text NOT NULL CHECK (side IN ('debit', 'credit')),
    account   text NOT NULL,
    amount    bigint NOT NULL CHECK (amount > 0),
    PRIMARY KEY (event_id, side)
);`

// EnsureSchema creates the ledger's tables when missing.
func EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("ledger: schema: %w", err)
	}
	return nil
}

// Ledger posts InvoicePaid.v1 events as double entries.
type Ledger struct {
	chart ChartOfAccounts
}

// New returns a Ledger posting to chart (validated: ErrInvalidChart).
func New(chart ChartOfAccounts) (*Ledger, error) {
	if err := chart.Validate(); err != nil {
		return nil, err
	}
	return &Ledger{chart: chart}, nil
}

const sqlPostEntry = `
INSERT INTO ledger_entries (event_id, invoice_id, tenant, currency, amount) VALUES ($1, $2, $3, $4, $5)`

const sqlPostLines = `
INSERT INTO ledger_lines (event_id, side, account, amount) VALUES ($1, 'debit', $2, $4), ($1, 'credit', $3, $4)`

// Handle is the events.Handler: it posts one InvoicePaid.v1 (the payload
// is inbox.InvoiceOutcome) as one journal entry debiting the chart's debit
// account and crediting its credit account by the amount, in tx (the
// transaction of the inbox claim, so the posting commits exactly when the
// event is marked processed). A zero amount posts nothing (a free invoice
// moves no money). Errors: ErrInvalidPayload; the database's, wrapped.
func (l *Ledger) Handle(ctx context.Context, tx pgx.Tx, d events.Delivery) error {
	if d.Type != inbox.EventInvoicePaid {
		return fmt.Errorf("%w: type %s", ErrInvalidPayload, d.Type)
	}
	var p inbox.InvoiceOutcome
	if err := json.Unmarshal(d.Payload, &p); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidPayload, err)
	}
	switch {
	case p.InvoiceID == "" || p.Tenant == "":
		return fmt.Errorf("%w: invoice_id and tenant are required", ErrInvalidPayload)
	case p.Amount == nil:
		return fmt.Errorf("%w: no amount", ErrInvalidPayload)
	case *p.Amount < 0:
		return fmt.Errorf("%w: negative amount", ErrInvalidPayload)
	case *p.Amount == 0:
		return nil
	case p.Currency == "":
		return fmt.Errorf("%w: no currency", ErrInvalidPayload)
	}
	if _, err := tx.Exec(ctx, sqlPostEntry, d.ID, p.InvoiceID, p.Tenant, p.Currency, *p.Amount); err != nil {
		return fmt.Errorf("ledger: post entry: %w", err)
	}
	if _, err := tx.Exec(ctx, sqlPostLines, d.ID, l.chart.Debit, l.chart.Credit, *p.Amount); err != nil {
		return fmt.Errorf("ledger: post lines: %w", err)
	}
	return nil
}
