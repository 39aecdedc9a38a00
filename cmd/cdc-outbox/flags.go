package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// flags is a flag set in which every flag can also come from an environment
// variable, CDC_OUTBOX_<NAME> (dashes become underscores). A flag on the
// command line wins over the environment, which wins over the default.
type flags struct {
	fs    *flag.FlagSet
	order []string // registration order, for help grouped as written
	about string
}

func newFlags(name, about string) *flags {
	f := &flags{fs: flag.NewFlagSet(name, flag.ContinueOnError), about: about}
	f.fs.SetOutput(io.Discard) // errors are returned; help is printed by usage
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

// parse reads args, then the environment for flags not given as args.
func (f *flags) parse(args []string, out io.Writer) error {
	if err := f.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			f.usage(out)
			return errHelp
		}
		return fmt.Errorf("%v (see %s --help)", err, f.fs.Name())
	}
	if f.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (see %s --help)", f.fs.Arg(0), f.fs.Name())
	}
	set := map[string]bool{}
	f.fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	for _, name := range f.order {
		if set[name] {
			continue
		}
		if v, ok := os.LookupEnv(envName(name)); ok {
			if err := f.fs.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %v", envName(name), v, err)
			}
		}
	}
	return nil
}

// usage prints every flag with its environment variable and default.
func (f *flags) usage(out io.Writer) {
	fmt.Fprintf(out, "%s\n\nUsage: %s [flags]\n\nFlags (each also settable as the environment variable shown):\n", f.about, f.fs.Name())
	for _, name := range f.order {
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
