package builder

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"toolshed.dev/shed/derivation"
	"toolshed.dev/shed/internal/hint"
	"toolshed.dev/shed/sandbox"
)

// accountsScript makes each account given as five arguments (name uid home shell sudo), as E2B's
// template builder and Debian's adduser do: useradd with a user private group of the same id and a
// home from /etc/skel; for sudo, the sudo group and a NOPASSWD rule in /etc/sudoers.d. Its exit codes
// above 100 are shed's own refusals (accountRefusals).
const accountsScript = `set -eu
command -v useradd >/dev/null || { echo "no useradd in the Workshop (Debian's passwd package makes accounts)" >&2; exit 101; }
while [ $# -ge 5 ]; do
	name=$1 uid=$2 home=$3 shell=$4 sudo=$5
	shift 5
	[ -x "$shell" ] || { echo "account $name: no shell $shell in the Workshop" >&2; exit 102; }
	if getent passwd "$name" >/dev/null; then echo "account $name: the seed or a layer has an account of that name" >&2; exit 103; fi
	if getent passwd "$uid" >/dev/null; then echo "account $name: uid $uid is $(getent passwd "$uid" | cut -d: -f1)'s in the seed or a layer" >&2; exit 104; fi
	if getent group "$name" >/dev/null || getent group "$uid" >/dev/null; then echo "account $name: the seed or a layer has a group $name or gid $uid" >&2; exit 105; fi
	mkdir -p "$(dirname "$home")"
	useradd --uid "$uid" --user-group --create-home --home-dir "$home" --shell "$shell" "$name"
	if [ "$sudo" = sudo ]; then
		[ -x /usr/bin/sudo ] || { echo "account $name: sudo = true, and the Workshop has no /usr/bin/sudo" >&2; exit 106; }
		! getent group sudo >/dev/null || usermod -aG sudo "$name"
		mkdir -p /etc/sudoers.d
		printf '%s ALL=(ALL:ALL) NOPASSWD: ALL\n' "$name" >"/etc/sudoers.d/90-shed-$name"
		chmod 0440 "/etc/sudoers.d/90-shed-$name"
	fi
done
`

// accountHints say what to do about each of accountsScript's refusals.
var accountHints = map[int]string{
	101: "an accounts layer runs useradd: use a Debian seed, or an image that has the passwd (shadow) package",
	102: "name a shell the Workshop has (shell = \"/bin/bash\" is in every Debian seed), or add the package that installs it",
	103: "the seed (an OCI image) has an account of that name already: give yours another name",
	104: "the seed (an OCI image) has an account with that uid already: set uid to a free one in [[account]]",
	105: "the seed has a group of that name or id: give the account another name or uid",
	106: "add \"sudo\" to [apt] packages: passwordless sudo is sudo's",
}

// buildAccountsLayer makes the recipe's accounts over the layer stack, in a sandbox with no network,
// and captures the overlay upper (passwd, group, shadow, the homes, sudoers files) as the layer.
func (b *Builder) buildAccountsLayer(ctx context.Context, d *derivation.Derivation, lowers []string, stage, out string, log io.Writer) error {
	upper, work := filepath.Join(stage, "upper"), filepath.Join(stage, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		return err
	}
	o, err := makeOutput(upper)
	if err != nil {
		return err
	}
	defer o.close()
	argv := []string{"/bin/sh", "-c", accountsScript, "sh"}
	for _, a := range d.Args {
		f := strings.Split(a, ":")
		if len(f) != 5 {
			return fmt.Errorf("%s: argument %q is not name:uid:home:shell:sudo", d.Name, a)
		}
		argv = append(argv, f...)
	}
	var stderr bytes.Buffer
	spec := &sandbox.Spec{
		Root: sandbox.Root{Lowers: lowers, Upper: upper, Work: work},
		Argv: argv,
		Env:  buildEnv(d),
	}
	code, err := sandbox.Run(ctx, spec, sandbox.Stdio{Stdout: log, Stderr: io.MultiWriter(log, &stderr)})
	if err != nil {
		return err
	}
	if code != 0 {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
			msg = msg[i+1:]
		}
		err := fmt.Errorf("%w: making the accounts: %s (exit %d)", ErrBuildFailed, msg, code)
		if h, ok := accountHints[code]; ok {
			return hint.Wrap(err, h)
		}
		return err
	}
	if err := o.normalize(); err != nil {
		return err
	}
	return o.moveTo(out)
}
