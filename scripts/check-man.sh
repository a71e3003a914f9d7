#!/usr/bin/env bash
# Checks the man page redis-lock(1) against the CLI it documents, so that the page cannot
# drift from it:
#
#   scripts/check-man.sh BIN PAGE      (PAGE: the roff source, or the installed .gz)
#
# - groff renders the page without a warning (-ww), and man(1) renders it;
# - every subcommand of `BIN --help` has its own section (`.SS "redis-lock SUB ...`);
# - every option of `BIN SUB --help` is named in SUB's section (its short or its long
#   form), and every form of every option (aliases too) is somewhere in the page;
# - every environment variable and every exit code of `BIN --help` is in the page.
# Prints what is missing and exits 1; exits 0 when nothing is. scripts/test-deb.sh runs it
# on the installed package.
set -euo pipefail

bin=${1:?usage: check-man.sh BIN PAGE}
page=${2:?usage: check-man.sh BIN PAGE}
case "$page" in
    *.gz) src=$(zcat "$page") ;;
    *) src=$(cat "$page") ;;
esac
problems=()

warnings=$(groff -man -Tutf8 -ww -z <<<"$src" 2>&1 || true)
[ -z "$warnings" ] || problems+=("groff warns: $warnings")
rendered=$(MANWIDTH=80 man -l - <<<"$src" 2>&1 || true)
grep -q '^NAME' <<<"$rendered" || problems+=("man -l renders no NAME section: $rendered")

# The page as plain text: roff's \- is a plain hyphen.
text=$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' <<<"$src")

# `word` as a whole option or name in $1 (not inside a longer one: -q is not --quiet).
has() {
    grep -qE -- "(^|[^A-Za-z0-9_-])$(sed 's/[.[\*^$]/\\&/g' <<<"$2")([^A-Za-z0-9_-]|$)" <<<"$1"
}

# The options of a help text, one line each: "short long aliases..." (short may be "").
options() {
    awk '
        /^(Options|Arguments|Commands):/ { sect = $1; next }
        /^[A-Z][a-z]+.*:$/ { sect = ""; next }
        sect == "Options:" && /^  (-[A-Za-z], |    )--[a-z]/ {
            line = $0
            short = ""
            if (match(line, /^ +-[A-Za-z],/)) { short = substr(line, RSTART, RLENGTH); gsub(/[ ,]/, "", short) }
            match(line, /--[a-z][a-z0-9-]*/)
            long = substr(line, RSTART, RLENGTH)
            print short " " long
            last = long
            next
        }
        sect == "Options:" && /\[alias(es)?: / {
            s = $0; sub(/.*\[alias(es)?: /, "", s); sub(/\].*/, "", s); gsub(/,/, " ", s)
            print "ALIAS " last " " s
        }
    ' <<<"$1"
}

# The text of the section `.SS "redis-lock SUB ...` up to the next .SS or .SH.
section() {
    awk -v sub_="$1" '
        /^\.S[SH]/ { on = ($0 ~ "^\\.SS \"?redis-lock " sub_ "( |\"|$)") ; next }
        on { print }
    ' <<<"$text"
}

top=$("$bin" --help)
subs=$(awk '/^Commands:/ { on = 1; next } /^$/ { on = 0 } on && /^  [a-z]/ { print $1 }' <<<"$top" |
    grep -vx help)
[ -n "$subs" ] || problems+=("no subcommands in '$bin --help'")
global=$(options "$top")

for form in $(tr ' ' '\n' <<<"$global" | grep -E '^-' || true); do
    has "$text" "$form" || problems+=("global option $form")
done
for sub in $subs; do
    sect=$(section "$sub")
    if [ -z "$sect" ]; then
        problems+=("subcommand $sub: no section .SS \"redis-lock $sub ...\"")
        continue
    fi
    while read -r first rest; do
        [ -n "$first" ] || continue
        if [ "$first" = ALIAS ]; then
            for a in $rest; do
                [ "$a" = "${rest%% *}" ] && continue
                has "$text" "$a" || problems+=("$sub: alias $a")
            done
            continue
        fi
        # Options every subcommand takes are the global ones.
        if grep -qxF -- "$first $rest" <<<"$global" || grep -qxF -- " $first" <<<"$global"; then
            continue
        fi
        named=0
        for form in $first $rest; do
            has "$text" "$form" || problems+=("$sub: option $form is nowhere in the page")
            has "$sect" "$form" && named=1
        done
        [ "$named" = 1 ] || problems+=("$sub: option $first${rest:+/$rest} is not in its section")
    done < <(options "$("$bin" "$sub" --help)")
done

# Environment variables and exit codes of the top-level help.
for var in $(awk '/^Environment:/ { on = 1; next } /^$/ { on = 0 } on' <<<"$top" |
    grep -oE '\b[A-Z][A-Z0-9_]{3,}\b' | sort -u); do
    has "$text" "$var" || problems+=("environment variable $var")
done
for code in $(awk '/^Exit codes:/ { on = 1; next } /^$/ { on = 0 } on' <<<"$top" |
    grep -oE '^ +[0-9]+(\+N)?' | tr -d ' '); do
    grep -qxF ".B $code" <<<"$text" || problems+=("exit code $code (as '.B $code' in EXIT STATUS)")
done

if [ ${#problems[@]} -gt 0 ]; then
    echo "check-man.sh: $page does not match $bin:" >&2
    printf '  %s\n' "${problems[@]}" >&2
    exit 1
fi
echo "check-man.sh: $page documents every subcommand, option, variable and exit code of $bin"
