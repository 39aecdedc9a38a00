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
// variable, CDC_OUTBOX_<NAME> (dashes become underscores), or from a YAML
// configuration file named by --config (or CDC_OUTBOX_CONFIG) whose keys are
// the flag names. A flag on the command line wins over the environment,
// which wins over the file, which wins over the default.
type flags struct {
	fs     *flag.FlagSet
	order  []string // registration order, for help grouped as written; --config is not in it
	about  string
	config string // --config
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

// parse reads args, then, for each flag not given as an arg, its
// environment variable or else its key in the configuration file. File
// values go through the flag's own parsing (fs.Set), like the others.
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
	for _, name := range f.order {
		if set[name] {
			continue
		}
		if v, ok := os.LookupEnv(envName(name)); ok {
			if err := f.fs.Set(name, v); err != nil {
				return fmt.Errorf("%s=%q: %v", envName(name), v, err)
			}
			continue
		}
		if v, ok := file[name]; ok {
			if err := f.fs.Set(name, v.value); err != nil {
				return fmt.Errorf("%s:%d: %s: %q: %v", path, v.line, name, v.value, err)
			}
		}
	}
	return nil
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
