package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// flags is a flag set in which every flag can also come from an environment
// variable, CDC_OUTBOX_<NAME> (dashes become underscores), or from a YAML
// configuration file named by --config (or CDC_OUTBOX_CONFIG) whose keys are
// the flag names. A flag on the command line wins over the environment,
// which wins over the file, which wins over the default.
type flags struct {
	fs     *flag.FlagSet
	order  []string // registration order, for help grouped as written; --config is not in it
	about  string
	config string // --config
	// origin is where parse found each flag that was not on the command
	// line: its environment variable, or file:line; set, the flags that
	// were.
	origin map[string]string
	set    map[string]bool
	// outboxes receives the configuration file's outboxes list, for the
	// command that has one (run's); nil for the others, which ignore it.
	outboxes *[]outboxEntry
}

// configFlag names the flag that names the configuration file. Every
// command has it; it is not a setting, so a file cannot set it.
const configFlag = "config"

func newFlags(name, about string) *flags {
	f := &flags{fs: flag.NewFlagSet(name, flag.ContinueOnError), about: about}
	f.fs.SetOutput(io.Discard) // errors are returned; help is printed by usage
	f.fs.StringVar(&f.config, configFlag, "", "YAML `file` of settings keyed by flag name (slot: cdc_outbox), as in cdc-outbox.example.yaml; "+
		"flags and environment variables win over it")
	return f
}

// envName is the environment variable of a flag.
func envName(flagName string) string {
	return "CDC_OUTBOX_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

func (f *flags) add(name string) { f.order = append(f.order, name) }

func (f *flags) String(p *string, name, def, usage string) {
	f.fs.StringVar(p, name, def, usage)
	f.add(name)
}

func (f *flags) Bool(p *bool, name string, def bool, usage string) {
	f.fs.BoolVar(p, name, def, usage)
	f.add(name)
}

func (f *flags) Int(p *int, name string, def int, usage string) {
	f.fs.IntVar(p, name, def, usage)
	f.add(name)
}

func (f *flags) Duration(p *time.Duration, name string, def time.Duration, usage string) {
	f.fs.DurationVar(p, name, def, usage)
	f.add(name)
}

// errHelp is returned by parse when help was asked for (and printed).
var errHelp = flag.ErrHelp

// load parses args and checks the result with validate, before anything
// connects anywhere. A usage or configuration error is printed on stderr
// and gives exit code 2; help gives 0. ok is false when the command must
// stop with code.
func (f *flags) load(args []string, validate func() error, stdout, stderr io.Writer) (code int, ok bool) {
	if err := f.parse(args, stdout); err != nil {
		if errors.Is(err, errHelp) {
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", f.fs.Name(), err)
		return 2, false
	}
	if err := validate(); err != nil {
		fmt.Fprintf(stderr, "%s: invalid configuration:\n%v\n", f.fs.Name(), f.attribute(err))
		return 2, false
	}
	return 0, true
}

// The flag package's errors for the command line, which parse rewrites
// into ours.
var (
	flagUnknown  = regexp.MustCompile(`^flag provided but not defined: -+(.*)$`)
	flagBadValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-+([^:]+): `)
	flagNoValue  = regexp.MustCompile(`^flag needs an argument: -+(.*)$`)
)

// parse reads args, then, for each flag not given as an arg, its
// environment variable or else its key in the configuration file. File
// values go through the flag's own parsing (fs.Set), like the others.
// A value that does not parse is reported with the flag's name, where it
// came from, the value and what the flag takes; an unknown flag with the
// nearest known one.
func (f *flags) parse(args []string, out io.Writer) error {
	f.origin = map[string]string{}
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(out)
			return errHelp
		}
		return f.commandLineError(err)
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see %s --help)", f.fs.Arg(0), f.fs.Name())
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	f.set = set
	path := f.config
	if v, ok := os.LookupEnv(envName(configFlag)); ok && !set[configFlag] {
		path = v
	}
	var file map[string]fileValue
	if path != "" {
		var err error
		if file, err = f.readConfigFile(path); err != nil {
			return err
		}
	}
	var bad []error
	for _, name := range f.order {
		if set[name] {
			continue
		}
		if v, ok := os.LookupEnv(envName(name)); ok {
			f.origin[name] = envName(name)
			if err := f.fs.Set(name, v); err != nil {
				bad = append(bad, f.badValue(name, v))
			}
			continue
		}
		if v, ok := file[name]; ok {
			f.origin[name] = fmt.Sprintf("%s:%d", path, v.line)
			if err := f.fs.Set(name, v.value); err != nil {
				bad = append(bad, f.badValue(name, v.value))
			}
		}
	}
	return errors.Join(bad...)
}

// commandLineError is the flag package's error for args in our words.
func (f *flags) commandLineError(err error) error {
	msg := err.Error()
	if m := flagUnknown.FindStringSubmatch(msg); m != nil {
		if s := suggest(m[1], append(f.order[:len(f.order):len(f.order)], configFlag)); s != "" {
			return fmt.Errorf("unknown flag --%s (did you mean --%s?)", m[1], s)
		}
		return fmt.Errorf("unknown flag --%s (see %s --help)", m[1], f.fs.Name())
	}
	if m := flagBadValue.FindStringSubmatch(msg); m != nil && f.fs.Lookup(m[2]) != nil {
		value, err := strconv.Unquote(`"` + m[1] + `"`) // the flag package quoted it
		if err != nil {
			value = m[1]
		}
		return f.badValue(m[2], value)
	}
	if m := flagNoValue.FindStringSubmatch(msg); m != nil && f.fs.Lookup(m[1]) != nil {
		return fmt.Errorf("--%s needs a value: %s", m[1], wantType(m[1], f.fs.Lookup(m[1])))
	}
	return fmt.Errorf("%v (see %s --help)", err, f.fs.Name())
}

// badValue says that a flag's value does not parse: which flag, set where,
// the value, and what it takes.
func (f *flags) badValue(name, value string) error {
	return fmt.Errorf("--%s%s %q: want %s", name, f.from(name), value, wantType(name, f.fs.Lookup(name)))
}

// given reports whether a flag was given a value: on the command line, by
// its environment variable or in the configuration file.
func (f *flags) given(name string) bool { return f.set[name] || f.origin[name] != "" }

// from says where a flag's value came from when not from the command line:
// " (from CDC_OUTBOX_SLOT)" or " (from cdc-outbox.yaml:3)".
func (f *flags) from(name string) string {
	if o := f.origin[name]; o != "" {
		return " (from " + o + ")"
	}
	return ""
}

// leadingFlag is the flag a validation message begins with.
var leadingFlag = regexp.MustCompile(`^--([a-z0-9-]+)`)

// attribute adds to each line of a validation error that begins with a
// flag set by an environment variable or the configuration file where it
// was set, so that the user knows what to change.
func (f *flags) attribute(err error) error {
	lines := strings.Split(err.Error(), "\n")
	for i, l := range lines {
		if m := leadingFlag.FindStringSubmatchIndex(l); m != nil {
			name := l[m[2]:m[3]]
			lines[i] = l[:m[1]] + f.from(name) + l[m[1]:]
		}
	}
	return errors.New(strings.Join(lines, "\n"))
}

// usage prints every flag with its environment variable and default.
func (f *flags) usage(out io.Writer) {
	fmt.Fprintf(out, "%s\n\nUsage: %s [--config file] [flags]\n\n"+
		"Flags (each also settable as the environment variable shown, or as a key of the --config file;\n"+
		"the command line wins over the environment, which wins over the file):\n", f.about, f.fs.Name())
	for _, name := range append(f.order[:len(f.order):len(f.order)], configFlag) {
		fl := f.fs.Lookup(name)
		typ, help := flag.UnquoteUsage(fl)
		head := "  --" + name
		if typ != "" {
			head += " " + typ
		}
		fmt.Fprintf(out, "%s\n      %s\n      env %s", head, help, envName(name))
		if fl.DefValue != "" {
			fmt.Fprintf(out, ", default %s", fl.DefValue)
		}
		fmt.Fprintln(out)
	}
}
