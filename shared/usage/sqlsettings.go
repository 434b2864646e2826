package usage

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aurora-billing/aurora/shared/identity"
	"github.com/aurora-billing/aurora/shared/outbox"
	"github.com/jackc/pgx/v5"
)

// SQLSettings is what the SQL API records with (aurora.recording_settings
// and aurora.feature_sources): the Gate's configuration, stored in the
// database because an application in another language has no aurora
// environment. It must say what the services' environment says
// (AURORA_STRIPE_ACCOUNT, AURORA_STRIPE_MODE, AURORA_USAGE_PERIOD,
// AURORA_FEATURE_SOURCES), or SQL-recorded usage would go elsewhere than the
// deliverers send.
type SQLSettings struct {
	DestinationAccount string        `json:"destination_account"`
	Mode               identity.Mode `json:"mode"`
	Period             Period        `json:"usage_period"`
	Exporter           string        `json:"exporter"` // default outbox.DefaultExporter
	Sources            Sources       `json:"feature_sources"`
}

// Gate returns the Gate that records exactly as the SQL API does with s.
func (s SQLSettings) Gate() Gate {
	return Gate{Recorder: Recorder{Exporter: s.Exporter, DestinationAccount: s.DestinationAccount, Mode: s.Mode, Period: s.Period}, Sources: s.Sources}
}

// Validate returns a *FieldError naming the first bad setting.
func (s SQLSettings) Validate() error {
	switch {
	case strings.TrimSpace(s.DestinationAccount) == "":
		return &FieldError{"destination_account", "must not be empty"}
	case !s.Mode.Valid():
		return &FieldError{"mode", fmt.Sprintf("%q is not test|live", string(s.Mode))}
	case !s.Period.Valid():
		return &FieldError{"usage_period", fmt.Sprintf("%q is not hour|day|month", string(s.Period))}
	}
	for f, src := range s.Sources {
		if !featureName.MatchString(f) || !src.Valid() {
			return &FieldError{"feature_sources", fmt.Sprintf("%q:%q is not feature:counters|events", f, string(src))}
		}
	}
	return nil
}

// WriteSQLSettings replaces the SQL API's settings with s in tx (the one
// settings row and every feature source). updatedBy names who did it.
// Errors: *FieldError for an invalid s.
func WriteSQLSettings(ctx context.Context, tx pgx.Tx, s SQLSettings, updatedBy string) error {
	if err := s.Validate(); err != nil {
		return err
	}
	if strings.TrimSpace(updatedBy) == "" {
		return &FieldError{"updated_by", "must not be empty"}
	}
	exporter := s.Exporter
	if exporter == "" {
		exporter = outbox.DefaultExporter
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO aurora.recording_settings (destination_account, mode, usage_period, exporter, updated_by)
		VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (singleton) DO UPDATE SET destination_account = EXCLUDED.destination_account, mode = EXCLUDED.mode,
			usage_period = EXCLUDED.usage_period, exporter = EXCLUDED.exporter, updated_by = EXCLUDED.updated_by, updated_at = now()`,
		s.DestinationAccount, string(s.Mode), string(s.Period), exporter, updatedBy); err != nil {
		return fmt.Errorf("usage: write sql settings: %w", err)
	}
	features := make([]string, 0, len(s.Sources))
	sources := make([]string, 0, len(s.Sources))
	for f, src := range s.Sources {
		features, sources = append(features, f), append(sources, string(src))
	}
	if _, err := tx.Exec(ctx, `DELETE FROM aurora.feature_sources WHERE NOT (feature = ANY($1))`, features); err != nil {
		return fmt.Errorf("usage: write sql settings: %w", err)
	}
	if _, err := tx.Exec(ctx, `
		INSERT INTO aurora.feature_sources (feature, source) SELECT * FROM unnest($1::text[], $2::text[])
		ON CONFLICT (feature) DO UPDATE SET source = EXCLUDED.source, updated_at = now()
		WHERE aurora.feature_sources.source <> EXCLUDED.source`, features, sources); err != nil {
		return fmt.Errorf("usage: write sql settings: %w", err)
	}
	return nil
}

// ReadSQLSettings returns the SQL API's settings; ErrNotConfigured when
// none were written.
func ReadSQLSettings(ctx context.Context, q outbox.Querier) (SQLSettings, error) {
	var s SQLSettings
	var mode, period string
	err := q.QueryRow(ctx, `SELECT destination_account, mode, usage_period, exporter FROM aurora.recording_settings`).
		Scan(&s.DestinationAccount, &mode, &period, &s.Exporter)
	if errors.Is(err, pgx.ErrNoRows) {
		return SQLSettings{}, ErrNotConfigured
	}
	if err != nil {
		return SQLSettings{}, fmt.Errorf("usage: read sql settings: %w", err)
	}
	s.Mode, s.Period = identity.Mode(mode), Period(period)
	rows, err := q.Query(ctx, `SELECT feature, source FROM aurora.feature_sources ORDER BY feature`)
	if err != nil {
		return SQLSettings{}, fmt.Errorf("usage: read sql settings: %w", err)
	}
	defer rows.Close()
	s.Sources = Sources{}
	for rows.Next() {
		var f, src string
		if err := rows.Scan(&f, &src); err != nil {
			return SQLSettings{}, fmt.Errorf("usage: read sql settings: %w", err)
		}
		s.Sources[f] = Source(src)
	}
	return s, rows.Err()
}
