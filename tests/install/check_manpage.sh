#!/usr/bin/env bash
# The man page says what --help says: every command and option any --help shows is in
# idemdesk.1, every option idemdesk.1 names is shown by some --help, and the page has no roff
# mistakes.   check_manpage.sh IDEMDESK_BINARY MAN_PAGE
set -euo pipefail
bin=$1 page=$2
export QT_QPA_PLATFORM=offscreen
fail=0

helps=$("$bin" --help)
commands=$(sed -n '/^Commands:/,/^$/p' <<<"$helps" | awk 'NR > 1 && NF { print $1 }')
[ -n "$commands" ] || { echo "no commands in idemdesk --help"; exit 1; }
for c in $commands; do
    helps+=$'\n'$("$bin" "$c" --help 2>/dev/null)
done
# keys has commands of its own ("  list [--state S] ...").
keys=$("$bin" keys --help | awk '/^  [a-z]/ { print $1 }' | sort -u)
for k in $keys; do
    helps+=$'\n'$("$bin" keys "$k" --help)
done

# The page as text, and its option names with roff's \- as -.
text=$(sed 's/\\-/-/g; s/\\f[BIRP]//g' "$page")
for c in $commands; do
    grep -Eq "^\.BI? \"?$c( |\"|$)" <<<"$text" || { echo "idemdesk.1: command '$c' (idemdesk --help) is not described"; fail=1; }
done
for k in $keys; do
    grep -Eq "^\.BI? \"?keys $k" <<<"$text" || { echo "idemdesk.1: 'keys $k' (idemdesk keys --help) is not described"; fail=1; }
done
help_options=$(grep -oE -- '--[a-z][a-z-]*' <<<"$helps" | sort -u)
page_options=$(grep -oE -- '--[a-z][a-z-]*' <<<"$text" | grep -v -- '--forward-to' | sort -u)
for o in $help_options; do
    grep -qx -- "$o" <<<"$page_options" || { echo "idemdesk.1: option $o (shown by --help) is missing"; fail=1; }
done
for o in $page_options; do
    grep -qx -- "$o" <<<"$help_options" || { echo "idemdesk.1: option $o is in the page but no --help shows it"; fail=1; }
done
grep -q "^\.SH EXIT STATUS" "$page" || { echo "idemdesk.1: no EXIT STATUS section"; fail=1; }
for code in 0 1 2; do
    grep -q "Exit codes:.*$code " <<<"$helps" || { echo "idemdesk --help: exit code $code not listed"; fail=1; }
done

warnings=$(groff -man -ww -z "$page" 2>&1)
[ -z "$warnings" ] || { echo "groff: $warnings"; fail=1; }
[ $fail -eq 0 ] && echo "idemdesk.1 matches --help: $(wc -w <<<"$commands") commands, $(wc -w <<<"$keys") keys commands, $(wc -w <<<"$help_options") options"
exit $fail
