package stripeemulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Error types of Stripe's error body (stripe-go v76 error.go).
const (
	TypeAPIError            = "api_error"
	TypeIdempotencyError    = "idempotency_error"
	TypeInvalidRequestError = "invalid_request_error"
)

// Error codes the emulator answers with. The meter-event configuration codes
// are the ones Stripe reports in `v1.billing.meter.error_report_triggered`
// (Stripe docs, "Meter error report codes"); Stripe reports them
// asynchronously, the emulator answers them synchronously as 400s so a caller
// can tell a configuration cause from a malformed request.
const (
	// CodeNoMeter: no active meter has the event's event_name.
	CodeNoMeter = "no_meter"
	// CodeArchivedMeter: the meter for event_name is inactive.
	CodeArchivedMeter = "archived_meter"
	// CodeCustomerNotFound: payload[<customer key>] names no known customer.
	CodeCustomerNotFound = "meter_event_customer_not_found"
	// CodeNoCustomerDefined: the payload lacks the meter's customer key.
	CodeNoCustomerDefined = "meter_event_no_customer_defined"
	// CodeValueNotFound: the payload lacks the meter's value key.
	CodeValueNotFound = "meter_event_value_not_found"
	// CodeInvalidValue: the payload value is not a finite number.
	CodeInvalidValue = "meter_event_invalid_value"
	// CodeValueTooManyDigits: the payload value has more than
	// MaxValueDigits significant digits (Stripe reports it asynchronously).
	CodeValueTooManyDigits = "meter_event_value_too_many_digits"
	// CodeTimestampTooFarInPast: timestamp older than 35 days.
	CodeTimestampTooFarInPast = "timestamp_too_far_in_past"
	// CodeTimestampInFuture: timestamp more than 5 minutes ahead.
	CodeTimestampInFuture = "timestamp_in_future"

	// CodeRateLimit: 429, too many (or concurrent) requests.
	CodeRateLimit = "rate_limit"
	// CodeIdempotencyKeyInUse: 409, the key's first request is still running.
	CodeIdempotencyKeyInUse = "idempotency_key_in_use"
	// CodeResourceMissing: 404 or a reference to an unknown object.
	CodeResourceMissing = "resource_missing"
	// CodeParameterMissing: a required parameter is absent.
	CodeParameterMissing = "parameter_missing"
	// CodeParameterUnknown: a parameter the endpoint does not take.
	CodeParameterUnknown = "parameter_unknown"
	// CodeParameterInvalidInteger: a parameter that must be an integer is not.
	CodeParameterInvalidInteger = "parameter_invalid_integer"
	// CodeParameterInvalid: a parameter has a value outside its allowed set.
	CodeParameterInvalid = "parameter_invalid_string"
	// CodeAdjustmentWindowPassed: cancel asked more than 24 h after receipt.
	CodeAdjustmentWindowPassed = "meter_event_adjustment_window_passed"
)

// DuplicateIdentifierMessagePrefix starts the message of Stripe's answer to a
// meter event whose identifier was seen within the dedupe window (reported by
// a public project; not stated in Stripe's docs, so unverified).
const DuplicateIdentifierMessagePrefix = "An event already exists with identifier"

// apiError is one error answer: HTTP status plus Stripe's error object.
type apiError struct {
	Status      int
	Type        string
	Code        string
	Message     string
	Param       string
	ShouldRetry string // value of Stripe-Should-Retry, "" = header absent
}

// errorBody is the JSON shape {"error":{…}}.
type errorBody struct {
	Error errorObject `json:"error"`
}

type errorObject struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	DocURL  string `json:"doc_url,omitempty"`
}

func (e *apiError) body() []byte {
	obj := errorObject{Type: e.Type, Code: e.Code, Message: e.Message, Param: e.Param}
	if e.Code != "" {
		obj.DocURL = "https://stripe.com/docs/error-codes/" + e.Code
	}
	b, _ := json.Marshal(errorBody{Error: obj}) // cannot fail: strings only
	return b
}

func invalidRequest(code, param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Type: TypeInvalidRequestError, Code: code, Param: param, Message: fmt.Sprintf(format, args...)}
}

func notFound(param, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusNotFound, Type: TypeInvalidRequestError, Code: CodeResourceMissing, Param: param, Message: fmt.Sprintf(format, args...)}
}

// Sentinel errors of the Go API (AddCustomer, AddMeter, Script, ParseFaults…).
var (
	// ErrInvalidFaults is wrapped by every *FaultSpecError.
	ErrInvalidFaults = errors.New("stripeemulator: invalid fault specification")
	// ErrInvalidAnswer is wrapped by every *AnswerError.
	ErrInvalidAnswer = errors.New("stripeemulator: invalid scripted answer")
	// ErrInvalidMeter: a meter definition lacks a field or names an event
	// already used by an active meter.
	ErrInvalidMeter = errors.New("stripeemulator: invalid meter")
	// ErrInvalidCustomer: a customer id that is empty or longer than 255
	// bytes.
	ErrInvalidCustomer = errors.New("stripeemulator: invalid customer")
	// ErrInvalidConfig: a Config field out of range.
	ErrInvalidConfig = errors.New("stripeemulator: invalid config")
)

// FaultSpecError is one bad item of a fault specification such as
// "http500=2". It wraps ErrInvalidFaults.
type FaultSpecError struct {
	Item   string // the offending item, e.g. "http500=2"
	Reason string // why it is refused, e.g. "rate must be within 0..1"
}

func (e *FaultSpecError) Error() string {
	return fmt.Sprintf("stripeemulator: fault %q: %s", e.Item, e.Reason)
}

// Unwrap returns ErrInvalidFaults.
func (e *FaultSpecError) Unwrap() error { return ErrInvalidFaults }

// AnswerError is a scripted answer that cannot be parsed, e.g. "418". It
// wraps ErrInvalidAnswer.
type AnswerError struct {
	Answer string
	Reason string
}

func (e *AnswerError) Error() string {
	return fmt.Sprintf("stripeemulator: answer %q: %s", e.Answer, e.Reason)
}

// Unwrap returns ErrInvalidAnswer.
func (e *AnswerError) Unwrap() error { return ErrInvalidAnswer }
