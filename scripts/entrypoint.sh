#!/bin/sh
# gpushim-entrypoint — container entrypoint that runs its arguments under libgpushim.so.
#
#   ENTRYPOINT ["gpushim-entrypoint"]
#   CMD ["python", "train.py"]
#
# It puts libgpushim.so first in LD_PRELOAD and replaces itself with the command (exec), so the
# program keeps PID 1's place, its signals and its exit status. The limits themselves are the
# shim's GPUSHIM_* variables (GPUSHIM_MEMORY_LIMIT, GPUSHIM_CONFIG, ...), passed on untouched.
#
# Variables read here (tool variables; the shim ignores them):
#   GPUSHIM_LIBRARY           the libgpushim.so to preload. Unset: ../lib/libgpushim.so or
#                             ./libgpushim.so next to this script, /usr/local/lib/libgpushim.so,
#                             /usr/lib/libgpushim.so. Not found: exit 127, nothing is run.
#   GPUSHIM_DISABLE           1/true/yes: run the command as is, without the shim.
#   GPUSHIM_ENTRYPOINT_CHECK  1/true/yes: run `gpushim check` first (the gpushim binary next to
#                             this script, else on PATH) and exit 1 if the configuration is bad.
#
# Exit status: the command's own; 2 without a command; 127 when the library cannot be found;
# 1 when GPUSHIM_ENTRYPOINT_CHECK is on and the check fails.
set -eu

me=gpushim-entrypoint

die() {
    status=$1
    shift
    printf '%s: %s\n' "$me" "$*" >&2
    exit "$status"
}

# 1, true, yes — any case, surrounding white space ignored (as the shim reads GPUSHIM_DISABLE)
is_true() {
    v=$1
    v=${v#"${v%%[![:space:]]*}"}
    v=${v%"${v##*[![:space:]]}"}
    case $v in
        1 | [Tt][Rr][Uu][Ee] | [Yy][Ee][Ss]) return 0 ;;
        *) return 1 ;;
    esac
}

# the absolute path of an existing file (symbolic links in the directory part resolved)
abs_file() {
    d=$(dirname -- "$1")
    b=$(basename -- "$1")
    d=$(cd -P -- "$d" 2>/dev/null && pwd -P) || return 1
    case $d in
        /) printf '/%s\n' "$b" ;;
        *) printf '%s/%s\n' "$d" "$b" ;;
    esac
}

if [ "$#" -eq 0 ]; then
    cat >&2 <<EOF
usage: $me COMMAND [ARGUMENTS...]
Runs COMMAND with libgpushim.so preloaded (LD_PRELOAD); GPUSHIM_* variables set its limits.
  GPUSHIM_LIBRARY=PATH          the library (default: ../lib/libgpushim.so next to this script,
                                /usr/local/lib/libgpushim.so, /usr/lib/libgpushim.so)
  GPUSHIM_DISABLE=1             run COMMAND without gpushim
  GPUSHIM_ENTRYPOINT_CHECK=1    run \`gpushim check\` first and stop if it fails
EOF
    exit 2
fi

if is_true "${GPUSHIM_DISABLE:-}"; then
    exec "$@"
fi

# Where this script is: as invoked, and (if it is a symbolic link) where it really lives.
self=$0
case $self in
    */*) ;;
    *) self=$(command -v -- "$self" 2>/dev/null || printf '%s' "$self") ;;
esac
script_dirs=$(dirname -- "$self")
if real=$(readlink -f -- "$self" 2>/dev/null) && [ -n "$real" ]; then
    real_dir=$(dirname -- "$real")
    [ "$real_dir" = "$script_dirs" ] || script_dirs="$script_dirs
$real_dir"
fi

if [ -n "${GPUSHIM_LIBRARY:-}" ]; then
    [ -f "$GPUSHIM_LIBRARY" ] ||
        die 127 "GPUSHIM_LIBRARY=$GPUSHIM_LIBRARY: no such file; set GPUSHIM_LIBRARY to the path of libgpushim.so (or GPUSHIM_DISABLE=1 to run without gpushim)"
    lib=$(abs_file "$GPUSHIM_LIBRARY") ||
        die 127 "GPUSHIM_LIBRARY=$GPUSHIM_LIBRARY: cannot resolve its directory"
else
    lib=
    tried=
    old_ifs=$IFS
    IFS='
'
    for d in $script_dirs; do
        tried="$tried
$d/../lib/libgpushim.so
$d/libgpushim.so"
    done
    tried="$tried
/usr/local/lib/libgpushim.so
/usr/lib/libgpushim.so"
    set -f
    for c in $tried; do
        if [ -z "$lib" ] && [ -f "$c" ]; then
            lib=$(abs_file "$c") || lib=
        fi
    done
    set +f
    IFS=$old_ifs
    [ -n "$lib" ] ||
        die 127 "cannot find libgpushim.so (looked at:$(printf '%s' "$tried" | tr '\n' ' ')); set GPUSHIM_LIBRARY=/path/to/libgpushim.so (or GPUSHIM_DISABLE=1 to run without gpushim)"
fi

if is_true "${GPUSHIM_ENTRYPOINT_CHECK:-}"; then
    tool=
    old_ifs=$IFS
    IFS='
'
    for d in $script_dirs; do
        if [ -z "$tool" ] && [ -f "$d/gpushim" ] && [ -x "$d/gpushim" ]; then
            tool=$d/gpushim
        fi
    done
    IFS=$old_ifs
    [ -n "$tool" ] || tool=$(command -v gpushim 2>/dev/null) || tool=
    if [ -n "$tool" ]; then
        # its report goes to stderr: the program's stdout stays the program's
        GPUSHIM_LIBRARY=$lib "$tool" check >&2 ||
            die 1 "\`gpushim check\` failed (see above); the program was not started"
    else
        printf '%s: warning: GPUSHIM_ENTRYPOINT_CHECK is set but no gpushim binary was found next to this script or on PATH; not checking\n' "$me" >&2
    fi
fi

# LD_PRELOAD = the library, then every other entry already there (ld.so separates entries by
# spaces or colons), the library itself not twice.
preload=$lib
old_ifs=$IFS
IFS=' :'
set -f
for entry in ${LD_PRELOAD:-}; do
    [ -n "$entry" ] || continue
    [ "$entry" = "$lib" ] && continue
    if [ -f "$entry" ] && [ "$(abs_file "$entry" 2>/dev/null || true)" = "$lib" ]; then
        continue
    fi
    preload="$preload:$entry"
done
set +f
IFS=$old_ifs
LD_PRELOAD=$preload
export LD_PRELOAD

exec "$@"
