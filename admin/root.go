package admin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"

	"github.com/spf13/cobra"
)

// Exit codes; see the package documentation.
const (
	ExitOK            = 0
	ExitFailure       = 1
	ExitInvalidInput  = 2
	ExitNotFound      = 3
	ExitStateMismatch = 4
	ExitRefused       = 5
	// ExitAttention: measured, and at least one figure needs a person
	// (auroractl status: a count only a person moves above zero, or an age
	// past its alert's objective).
	ExitAttention = 6
)

// ExitError carries an exit code and a one-line message that says what to
// do.
type ExitError struct {
	Code int
	Msg  string
	Err  error
}

func (e *ExitError) Error() string { return e.Msg }

// Unwrap returns the cause.
func (e *ExitError) Unwrap() error { return e.Err }

func invalidInput(format string, args ...any) error {
	return &ExitError{Code: ExitInvalidInput, Msg: fmt.Sprintf(format, args...)}
}

// errValidated ends a --validate run successfully without running the
// command.
var errValidated = errors.New("auroractl: configuration validated")

// IO holds the streams a command writes to.
type IO struct {
	Out io.Writer
	Err io.Writer
}

// NewRootCmd returns the auroractl command tree writing to streams.
func NewRootCmd(streams IO) *cobra.Command {
	root := &cobra.Command{
		Use:           "auroractl",
		Short:         "Operate aurora: migrations, keys, recovery, reconciliation, cutover, inbox dead letters",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	var validate bool
	root.PersistentFlags().BoolVar(&validate, "validate", false, "check the configuration (AURORA_DATABASE_URL, AURORA_ACTOR) and exit")
	check := func(cmd *cobra.Command) error {
		if _, err := databaseURL(); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "configuration valid (actor %s)\n", Actor(""))
		return errValidated
	}
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		if err := checkFlags(cmd); err != nil {
			return err
		}
		if err := checkArgs(args); err != nil {
			return err
		}
		if validate {
			return check(cmd)
		}
		return requireSchema(cmd)
	}
	root.RunE = func(cmd *cobra.Command, _ []string) error {
		if validate {
			return check(cmd)
		}
		return cmd.Help()
	}
	root.SetOut(streams.Out)
	root.SetErr(streams.Err)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		return &ExitError{Code: ExitInvalidInput, Msg: err.Error() + " (see --help)", Err: err}
	})
	root.AddCommand(
		newKeyCmd(),
		newMigrateCmd(),
		newProvisionCmd(),
		// subcommands: add one line each, below this marker
		newCutoverCmd(),
		newEventsCmd(),
		newInboxCmd(),
		newRecoveryCmd(),
		newStatusCmd(),
		newReconcileCmd(),
		newUsageCmd(),
	)
	return root
}

// Main runs auroractl with args and returns the process exit code. Errors
// are printed as one line on streams.Err; before the command runs, each
// AURORA_* variable of the environment that no aurora component reads is
// warned about on streams.Err (one line each, with the closest known
// name; the exit code is unchanged).
func Main(ctx context.Context, args []string, streams IO) int {
	warnUnknownVars(streams.Err, os.Environ())
	root := NewRootCmd(streams)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if err == nil || errors.Is(err, errValidated) {
		return ExitOK
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		fmt.Fprintln(streams.Err, "auroractl: "+ee.Msg)
		return ee.Code
	}
	// cobra's own argument errors (unknown command, arg count) are invalid input.
	msg := err.Error()
	if strings.HasPrefix(msg, "unknown command") || strings.HasPrefix(msg, "accepts ") || strings.HasPrefix(msg, "requires ") ||
		strings.HasPrefix(msg, "unknown flag") || strings.HasPrefix(msg, "required flag") {
		fmt.Fprintln(streams.Err, "auroractl: "+msg+" (see --help)")
		return ExitInvalidInput
	}
	fmt.Fprintln(streams.Err, "auroractl: "+msg)
	return ExitFailure
}

// Actor resolves who is acting: flag, else AURORA_ACTOR, else the OS user.
func Actor(flag string) string {
	if strings.TrimSpace(flag) != "" {
		return flag
	}
	if a := strings.TrimSpace(os.Getenv("AURORA_ACTOR")); a != "" {
		return a
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "unknown"
}
