package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"
	"golang.org/x/term"

	"toolshed.dev/shed/app"
	"toolshed.dev/shed/secret"
)

func cmdSecret() *cli.Command {
	return &cli.Command{
		Name:  "secret",
		Usage: "keep credentials in the supervisor: Benches use them through their proxy and hold only placeholders",
		Subcommands: []*cli.Command{{
			Name:      "add",
			Usage:     "store a secret, read from stdin (or --file), bound to hosts and a place in their requests",
			ArgsUsage: "NAME",
			Description: "The value is read from stdin, or from --file (one trailing newline is dropped). It is kept\n" +
				"0600 under the store's root (secrets/), never in a record, a lock, provenance, the audit log or a log.\n" +
				"A Bench that names the secret (--secret, or [network] secrets in its recipe) gets a random\n" +
				"placeholder in $ENV; its proxy puts the value in place of it only in requests to --host, at the\n" +
				"place given: --header \"Authorization: Bearer {}\", --basic, or --query PARAM. See docs/secrets.md.",
			Flags: []cli.Flag{
				&cli.StringSliceFlag{Name: "host", Usage: "a destination it may go to, HOST[:PORT] (443 if none); repeat for more"},
				&cli.StringFlag{Name: "header", Usage: "the header it goes in, with {} for it: \"Authorization: Bearer {}\""},
				&cli.BoolFlag{Name: "basic", Usage: "it is basic auth's user name or password"},
				&cli.StringFlag{Name: "query", Usage: "it is the value of this query parameter"},
				&cli.BoolFlag{Name: "body", Usage: "replace its placeholder in request bodies too (headers and URL only by default)"},
				&cli.StringFlag{Name: "env", Usage: "the variable a Bench finds its placeholder in (default: NAME in capitals)"},
				&cli.StringFlag{Name: "owner", Usage: "the user who may use it (operators; a user's secrets are their own)"},
				&cli.StringFlag{Name: "file", Usage: "read the value from this file instead of stdin"},
				&cli.BoolFlag{Name: "replace", Usage: "replace a secret of that name (a new version; running Benches use it from their next request)"},
			},
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return usageError("shed secret add NAME --host HOST --header \"Authorization: Bearer {}\" < token")
				}
				places := 0
				place := ""
				if h := c.String("header"); h != "" {
					places, place = places+1, "header:"+h
				}
				if c.Bool("basic") {
					places, place = places+1, "basic"
				}
				if q := c.String("query"); q != "" {
					places, place = places+1, "query:"+q
				}
				if places > 1 {
					return withHint(exitUsage, errors.New("secret add: one of --header, --basic and --query"), "a secret goes in one place of a request")
				}
				value, err := readSecretValue(c)
				if err != nil {
					return err
				}
				res, err := call[app.SecretResult](c, "secret.add", &app.SecretAddRequest{
					Name: c.Args().First(), Value: value, Hosts: c.StringSlice("host"), Place: place,
					Env: c.String("env"), Body: c.Bool("body"), Owner: c.String("owner"), Replace: c.Bool("replace"),
				})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c, res.Secret)
				}
				s := res.Secret
				fmt.Fprintf(c.App.Writer, "secret %s (version %d): a Bench that names it finds its placeholder in $%s\n", s.Name, s.Version, s.Env)
				if len(s.Hosts) > 0 {
					fmt.Fprintf(c.App.Writer, "goes to %s, as %s\n", hostsOf(s), s.Place)
				}
				return nil
			},
		}, {
			Name:  "ls",
			Usage: "list the secrets you may use: name, owner, variable, hosts, place (never a value)",
			Action: func(c *cli.Context) error {
				res, err := call[app.SecretListResult](c, "secret.ls", &app.Empty{})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c, res.Secrets)
				}
				tw := tabwriter.NewWriter(c.App.Writer, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "NAME\tOWNER\tENV\tHOSTS\tPLACE\tVERSION\tUPDATED")
				for _, s := range res.Secrets {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", s.Name, orDash(s.Owner, "(operators)"), s.Env, orDash(hostsOf(s), "-"), s.Place, s.Version, s.Updated.Local().Format(time.DateTime))
				}
				return tw.Flush()
			},
		}, {
			Name:      "rm",
			Usage:     "revoke a secret: Benches that use it are refused from their next request on",
			ArgsUsage: "NAME",
			Action: func(c *cli.Context) error {
				if c.NArg() != 1 {
					return withHint(exitUsage, errors.New("secret rm wants one secret's name"), "`shed secret ls` lists them")
				}
				res, err := call[app.SecretResult](c, "secret.rm", &app.SecretRequest{Name: c.Args().First()})
				if err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c, res.Secret)
				}
				fmt.Fprintf(c.App.Writer, "revoked secret %s\n", res.Secret.Name)
				return nil
			},
		}},
	}
}

// secretFlag names secrets a Bench may use, beside its recipe's.
var secretFlag = &cli.StringSliceFlag{Name: "secret", Usage: "let the Bench use secret `NAME` through its proxy (it gets a placeholder in the secret's variable; repeatable)"}

// readSecretValue reads the value from --file or stdin, dropping one trailing newline (echo's).
func readSecretValue(c *cli.Context) ([]byte, error) {
	var r io.Reader = c.App.Reader
	if f := c.String("file"); f != "" {
		fh, err := os.Open(f)
		if err != nil {
			return nil, withHint(exitUsage, err, "--file names a file with the value alone")
		}
		defer fh.Close()
		r = fh
	} else if in, ok := c.App.Reader.(*os.File); ok && term.IsTerminal(int(in.Fd())) {
		// Typed, it is not echoed: one line.
		fmt.Fprint(c.App.ErrWriter, "secret value: ")
		b, err := term.ReadPassword(int(in.Fd()))
		fmt.Fprintln(c.App.ErrWriter)
		if err != nil {
			return nil, err
		}
		r = bytes.NewReader(b)
	}
	b, err := io.ReadAll(io.LimitReader(r, secret.MaxValue+2))
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSuffix(bytes.TrimSuffix(b, []byte("\n")), []byte("\r"))
	if len(b) == 0 {
		return nil, withHint(exitUsage, errors.New("secret add: the value is empty"), "pipe it in: shed secret add NAME ... < token-file")
	}
	return b, nil
}

func hostsOf(s secret.Secret) string {
	var hs []string
	for _, h := range s.Hosts {
		hs = append(hs, h.String())
	}
	return strings.Join(hs, ",")
}

func orDash(s, d string) string {
	if s == "" {
		return d
	}
	return s
}
