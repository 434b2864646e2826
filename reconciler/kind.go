package reconciler

// Kind names a reconciliation item: one kind of difference between what
// aurora committed and what the provider (or the local ledger) shows. Each
// constant's comment is its detection rule; docs/reconciler.md repeats
// them. Seed 000 names three of the ten (summary_shortfall, unmapped_price,
// reversal_without_grant).
type Kind string

const (
	// KindSummaryShortfall: a settled summary window of a (destination
	// account, customer, meter) holds less than the quantity aurora
	// committed there (accepted and confirmed items whose meter event
	// timestamp lies in the window, each counted at the value it carries at
	// Stripe). Usage Stripe will not bill. The items of the window are
	// named; none of them is confirmed.
	KindSummaryShortfall Kind = "summary_shortfall"
	// KindSummaryExcess: a settled summary window holds more than aurora
	// committed there: Stripe counts usage aurora did not commit, a double
	// bill (an identifier applied twice, or an uncertain item that landed —
	// the detail names uncertain items in the window when there are).
	KindSummaryExcess Kind = "summary_excess"
	// KindAsyncRejection: a Stripe meter error report
	// (v1.billing.meter.error_report_triggered / no_meter_found) carries a
	// sample error whose identifier is an accepted or confirmed item's
	// idempotency key: Stripe answered 200 and rejected the event later. The
	// item is named; it is never confirmed and never resent by the
	// reconciler.
	KindAsyncRejection Kind = "async_rejection"
	// KindErrorReportUnattributed: a meter error report counts more errors
	// than its samples attribute to aurora's items (a report carries counts
	// and a few samples, not every failed event). The summaries comparison
	// finds the rest as summary_shortfall; this item says the report exists.
	KindErrorReportUnattributed Kind = "error_report_unattributed"
	// KindUnconfirmedAcceptance: an item has been accepted for longer than
	// the confirm horizon (AURORA_RECONCILER_CONFIRM_HORIZON_SECONDS) and is
	// still not confirmed: no settled window ever covered it (its customer
	// or meter mapping is gone, the window never matched, or the provider
	// was never asked).
	KindUnconfirmedAcceptance Kind = "unconfirmed_acceptance"
	// KindLateAfterFinalization: an item whose meter event timestamp lies
	// in a finalized invoice's line period was accepted after that invoice
	// finalized: Stripe knows the usage but never bills it.
	KindLateAfterFinalization Kind = "late_after_finalization"
	// KindInvoiceQuantityMismatch: a finalized invoice's metered line
	// quantity differs from what aurora committed and had accepted by the
	// invoice's finalization for that customer, meter and line period, and
	// late acceptances do not explain it.
	KindInvoiceQuantityMismatch Kind = "invoice_quantity_mismatch"
	// KindUnmappedPrice: a finalized invoice bills a metered price whose
	// meter no aurora feature maps to on the destination account: usage
	// billed there is not aurora's, or a mapping is missing.
	KindUnmappedPrice Kind = "unmapped_price"
	// KindReversalWithoutGrant: a negative correction (a reversal) that
	// Stripe cannot carry — quarantined negative_quantity: past the cancel
	// window, or its corrected record never reached Stripe — so the
	// customer is owed a credit nobody has granted. Resolving records the
	// grant.
	KindReversalWithoutGrant Kind = "reversal_without_grant"
	// KindLocalDrift: the local check (Local) found a ledger position that
	// claims to have reported more than the counter it reported (see
	// DriftRule): a physically impossible state.
	KindLocalDrift Kind = "local_drift"
)

// Kinds lists every kind (the CHECK constraint of
// reconciliation_items.kind holds the same ten).
var Kinds = []Kind{
	KindSummaryShortfall, KindSummaryExcess, KindAsyncRejection, KindErrorReportUnattributed,
	KindUnconfirmedAcceptance, KindLateAfterFinalization, KindInvoiceQuantityMismatch,
	KindUnmappedPrice, KindReversalWithoutGrant, KindLocalDrift,
}

// Valid reports whether k is one of Kinds.
func (k Kind) Valid() bool {
	for _, c := range Kinds {
		if c == k {
			return true
		}
	}
	return false
}

// State is a reconciliation item's state.
type State string

const (
	// StateOpen: found, nobody has resolved it.
	StateOpen State = "open"
	// StateResolved: a person recorded what they did about it.
	StateResolved State = "resolved"
)
