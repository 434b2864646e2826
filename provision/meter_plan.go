package provision

import (
	"context"
	"errors"
	"fmt"

	"github.com/aurora-billing/aurora/shared/field"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// MappingAction is what applying a MeterPlan does to meter_mappings.
type MappingAction string

const (
	// MappingUnchanged: the feature already maps to that meter; nothing is
	// written.
	MappingUnchanged MappingAction = "unchanged"
	// MappingNew: the feature had no mapping; it gets version 1.
	MappingNew MappingAction = "map"
	// MappingRemap: the feature maps to another meter; mapping_version
	// increments, and items built for the old version are quarantined
	// feature_unmapped at send time (restage them:
	// recovery.Service.Restage).
	MappingRemap MappingAction = "remap"
)

// MeterSource is where the plan's meter comes from.
type MeterSource string

const (
	MeterKeep   MeterSource = "keep"   // the mapped meter, unchanged
	MeterCreate MeterSource = "create" // a new meter is created at Stripe on apply
	MeterAdopt  MeterSource = "adopt"  // an existing active Stripe meter is mapped
)

// StagedImpact counts the feature's items on the account a remap affects.
type StagedImpact struct {
	// InFlight: pending or leased items built for the current version. After
	// a remap the deliverer quarantines them feature_unmapped (an item
	// already being sent may still reach the old meter).
	InFlight int `json:"in_flight"`
	// Restageable: quarantined items built for another version than the
	// one the plan maps (after apply, recovery restage rebuilds them).
	Restageable int `json:"restageable"`
}

// MeterPlan is what Meter would do, computed without writing anything
// (PlanMeter) and applied by ApplyMeter.
type MeterPlan struct {
	Account string `json:"account"`
	Feature string `json:"feature"`
	// Current is the mapping now (nil: the feature is not mapped).
	Current *Mapping `json:"current"`
	// Next is the mapping after apply; MeterID is "" when the meter is to
	// be created.
	Next    Mapping       `json:"next"`
	Action  MappingAction `json:"action"`
	Meter   MeterSource   `json:"meter"`
	Staged  StagedImpact  `json:"staged"`
	valueOK bool          // Next's keys were read from the adopted meter
	custKey string
	valKey  string
}

// ErrMeterUnusable: the meter to adopt (named, or the active meter already
// holding the event name) is inactive or does not sum its values, so
// aurora's quantities would not add up. The concrete error is
// *MeterUnusableError.
var ErrMeterUnusable = errors.New("provision: meter_unusable")

// MeterUnusableError names the meter and why it cannot be mapped.
type MeterUnusableError struct {
	MeterID string
	Reason  string
}

func (e *MeterUnusableError) Error() string {
	return fmt.Sprintf("provision: meter_unusable: meter %s %s", e.MeterID, e.Reason)
}

// Unwrap returns ErrMeterUnusable.
func (e *MeterUnusableError) Unwrap() error { return ErrMeterUnusable }

// ErrMappingMoved: the feature's mapping changed between PlanMeter and
// ApplyMeter (another operator); nothing was written to meter_mappings.
// Plan again.
var ErrMappingMoved = errors.New("provision: mapping_moved")

// PlanMeter returns what mapping feature to a meter would do (a
// *FieldError, ErrInvalid, as for Meter). With adoptMeterID the feature is
// mapped to that existing Stripe meter (its event name; eventName must be
// "" or equal to it). Otherwise to a meter with eventName: the mapped one
// if it has that event name, else an active Stripe meter that already has
// it (adopted: Stripe allows one active meter per event name, so a mapping
// can be moved back), else a new one. It reads meter_mappings, the staged
// items and Stripe (GET or list meters) and writes nothing. Errors:
// *MeterUnusableError (ErrMeterUnusable) for an inactive or non-sum meter.
func PlanMeter(ctx context.Context, pool *pgxpool.Pool, api *client.API, account, feature, eventName, adoptMeterID string) (MeterPlan, error) {
	return planMeter(ctx, pool, api, account, feature, eventName, adoptMeterID, true)
}

// planMeter is PlanMeter; without lookup it does not list Stripe's meters
// and plans to create one (Meter's first try: one request fewer).
func planMeter(ctx context.Context, pool *pgxpool.Pool, api *client.API, account, feature, eventName, adoptMeterID string, lookup bool) (MeterPlan, error) {
	if err := checkAccount(account); err != nil {
		return MeterPlan{}, err
	}
	if r := field.Feature(feature); r != "" {
		return MeterPlan{}, &FieldError{Field: "feature", Reason: r}
	}
	if eventName != "" || adoptMeterID == "" {
		if r := field.Text(eventName, field.MaxFeatureBytes); r != "" {
			return MeterPlan{}, &FieldError{Field: "event_name", Reason: r}
		}
	}
	if adoptMeterID != "" {
		if r := field.Text(adoptMeterID, field.MaxStripeIDBytes); r != "" {
			return MeterPlan{}, &FieldError{Field: "meter_id", Reason: r}
		}
	}
	p := MeterPlan{Account: account, Feature: feature}
	var cur Mapping
	err := pool.QueryRow(ctx, `SELECT meter_id, event_name, mapping_version FROM meter_mappings WHERE destination_account = $1 AND feature = $2`,
		account, feature).Scan(&cur.MeterID, &cur.EventName, &cur.MappingVersion)
	switch {
	case err == nil:
		cur.Feature = feature
		p.Current = &cur
	case !errors.Is(err, pgx.ErrNoRows):
		return MeterPlan{}, fmt.Errorf("provision: meter: %w", err)
	}

	var adopt *stripe.BillingMeter
	switch {
	case adoptMeterID != "":
		m, err := api.BillingMeters.Get(adoptMeterID, nil)
		if err != nil {
			return MeterPlan{}, fmt.Errorf("provision: meter %s: %w", adoptMeterID, err)
		}
		if eventName != "" && eventName != m.EventName {
			return MeterPlan{}, &FieldError{Field: "event_name", Reason: fmt.Sprintf("meter %s records event %q, not %q", m.ID, m.EventName, eventName)}
		}
		adopt = m
	case p.Current != nil && p.Current.EventName == eventName:
		// keep the mapped meter
	case lookup:
		m, err := activeMeterFor(api, eventName)
		if err != nil {
			return MeterPlan{}, err
		}
		adopt = m
	}

	p.Next = Mapping{Feature: feature, EventName: eventName}
	switch {
	case adopt != nil:
		if err := usable(adopt); err != nil {
			return MeterPlan{}, err
		}
		p.Meter, p.Next.MeterID, p.Next.EventName = MeterAdopt, adopt.ID, adopt.EventName
		p.valueOK, p.custKey, p.valKey = true, adopt.CustomerMapping.EventPayloadKey, adopt.ValueSettings.EventPayloadKey
	case p.Current != nil && p.Current.EventName == eventName:
		p.Meter, p.Next.MeterID = MeterKeep, p.Current.MeterID
	default:
		p.Meter = MeterCreate
	}
	switch {
	case p.Current == nil:
		p.Action, p.Next.MappingVersion = MappingNew, 1
	case p.Next.MeterID == p.Current.MeterID:
		p.Action, p.Next = MappingUnchanged, *p.Current
		p.Meter = MeterKeep
	default:
		p.Action, p.Next.MappingVersion = MappingRemap, p.Current.MappingVersion+1
	}
	curVersion := int32(0)
	if p.Current != nil {
		curVersion = p.Current.MappingVersion
	}
	// Pending and leased items through outbox_undecided, quarantined ones
	// through their reason's index: outbox_items has no index on state
	// (migration 00311).
	err = pool.QueryRow(ctx, `
		SELECT (SELECT count(*) FROM outbox_undecided u JOIN outbox_items o ON o.id = u.item_id
		         WHERE o.destination_account = $1 AND o.feature = $2 AND o.state IN ('pending', 'leased')
		           AND o.mapping_version = $3),
		       (SELECT count(*) FROM outbox_items
		         WHERE quarantine_reason IS NOT NULL AND destination_account = $1 AND feature = $2
		           AND mapping_version <> $4)`,
		account, feature, curVersion, p.Next.MappingVersion).Scan(&p.Staged.InFlight, &p.Staged.Restageable)
	if err != nil {
		return MeterPlan{}, fmt.Errorf("provision: meter: staged items: %w", err)
	}
	if p.Action != MappingRemap {
		p.Staged.InFlight = 0 // nothing built for a version that stays current is affected
	}
	return p, nil
}

// activeMeterFor returns the active Stripe meter recording eventName, or
// nil.
func activeMeterFor(api *client.API, eventName string) (*stripe.BillingMeter, error) {
	params := &stripe.BillingMeterListParams{Status: stripe.String("active")}
	params.Limit = stripe.Int64(100)
	it := api.BillingMeters.List(params)
	for it.Next() {
		if m := it.BillingMeter(); m.EventName == eventName {
			return m, nil
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("provision: list meters: %w", err)
	}
	return nil, nil
}

func usable(m *stripe.BillingMeter) error {
	switch {
	case m.Status != stripe.BillingMeterStatusActive:
		return &MeterUnusableError{MeterID: m.ID, Reason: "is not active (reactivate it at Stripe, or map another)"}
	case m.DefaultAggregation == nil || m.DefaultAggregation.Formula != stripe.BillingMeterDefaultAggregationFormulaSum:
		return &MeterUnusableError{MeterID: m.ID, Reason: "does not aggregate with sum; aurora's quantities add up only on a sum meter"}
	case m.CustomerMapping == nil || m.CustomerMapping.EventPayloadKey == "" || m.ValueSettings == nil || m.ValueSettings.EventPayloadKey == "":
		return &MeterUnusableError{MeterID: m.ID, Reason: "has no customer or value payload key"}
	}
	return nil
}

// ApplyMeter carries out p: creates the meter at Stripe when p.Meter is
// MeterCreate, then writes the mapping only if it is still what PlanMeter
// read (else ErrMappingMoved; a meter created here is then left unmapped at
// Stripe and named in the error). Returns the mapping now.
func ApplyMeter(ctx context.Context, pool *pgxpool.Pool, api *client.API, p MeterPlan) (Mapping, error) {
	if p.Action == MappingUnchanged {
		return p.Next, nil
	}
	next, custKey, valKey := p.Next, CustomerKey, ValueKey
	if p.valueOK {
		custKey, valKey = p.custKey, p.valKey
	}
	if p.Meter == MeterCreate {
		meter, err := api.BillingMeters.New(&stripe.BillingMeterParams{
			DisplayName:        stripe.String(p.Feature),
			EventName:          stripe.String(next.EventName),
			DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")},
			CustomerMapping:    &stripe.BillingMeterCustomerMappingParams{EventPayloadKey: stripe.String(CustomerKey), Type: stripe.String("by_id")},
			ValueSettings:      &stripe.BillingMeterValueSettingsParams{EventPayloadKey: stripe.String(ValueKey)},
		})
		if err != nil {
			return Mapping{}, fmt.Errorf("provision: create meter for %s: %w", p.Feature, err)
		}
		next.MeterID, next.Created = meter.ID, true
	}
	var tag interface{ RowsAffected() int64 }
	var err error
	if p.Current == nil {
		tag, err = pool.Exec(ctx, `
			INSERT INTO meter_mappings (destination_account, feature, meter_id, event_name, customer_key, value_key, mapping_version)
			VALUES ($1, $2, $3, $4, $5, $6, 1) ON CONFLICT (destination_account, feature) DO NOTHING`,
			p.Account, p.Feature, next.MeterID, next.EventName, custKey, valKey)
	} else {
		tag, err = pool.Exec(ctx, `
			UPDATE meter_mappings SET meter_id = $3, event_name = $4, customer_key = $5, value_key = $6,
				mapping_version = mapping_version + 1, updated_at = now()
			WHERE destination_account = $1 AND feature = $2 AND mapping_version = $7 AND meter_id = $8`,
			p.Account, p.Feature, next.MeterID, next.EventName, custKey, valKey, p.Current.MappingVersion, p.Current.MeterID)
	}
	if err != nil {
		return Mapping{}, fmt.Errorf("provision: meter mapping: %w", err)
	}
	if tag.RowsAffected() != 1 {
		if next.Created {
			return Mapping{}, fmt.Errorf("%w: feature %s on %s changed since the plan (meter %s was created and is not mapped)", ErrMappingMoved, p.Feature, p.Account, next.MeterID)
		}
		return Mapping{}, fmt.Errorf("%w: feature %s on %s changed since the plan", ErrMappingMoved, p.Feature, p.Account)
	}
	return next, nil
}
