# bash completion for heapsnap(1).
#
#   source tools/heapsnap-completion.bash
# or install it as /usr/share/bash-completion/completions/heapsnap.
#
# The subcommands, their options and the values of choice options
# ({text,json,...}) are read from `heapsnap --help` and `heapsnap SUB
# --help` (CLI11's listing) once per shell and binary, so the completion
# follows the heapsnap it completes instead of a copy of its option list
# that would drift. What the help cannot say is known here:
#   run       options, then after `--` a command and that command's files;
#             --snapshot-when: the kinds of rule, quoted ('rss> ...), since
#             > is the shell's
#   snapshot  a PID of the user's processes or a log; --at: the markers of
#             that log; -o: files
#   diff      .hsnap and .hslog files, LOG@MARKER with the markers of LOG
#             (labels, indices, exit, peak, end) and LOG@* (every marker)
#   report    like diff, without LOG@*
#   markers, dump   .hslog files
#   maps      a PID, a .hsnap, or LOG@MARKER
#   ps        options only
#   attach, detach, pause, resume   a PID of the user's processes
# Needs nothing but bash (not the bash-completion package).

# Prints "NAME TAKES_VALUE CHOICES" per option of `heapsnap $1` ($1 empty:
# the top level), e.g. "--format 1 text,json,csv" or "--bytes 0 -".
_heapsnap_option_table() {
    local bin=$1 sub=$2 line names rest takes choices n
    # shellcheck disable=SC2086
    "$bin" $sub --help 2>/dev/null | while IFS= read -r line; do
        [[ $line =~ ^\ \ (-[A-Za-z0-9],)?(--[A-Za-z0-9-]+)(.*)$ ]] || continue
        names="${BASH_REMATCH[2]}"
        [[ -n ${BASH_REMATCH[1]} ]] && names="${BASH_REMATCH[1]%,} $names"
        rest=${BASH_REMATCH[3]}
        takes=0
        [[ $rest =~ ^\ ([A-Z]+)(:|=|\ |$) ]] && takes=1
        choices=-
        [[ $rest =~ \{([^}]*)\} ]] && choices=${BASH_REMATCH[1]}
        for n in $names; do
            printf '%s %s %s\n' "$n" "$takes" "$choices"
        done
    done
}

_heapsnap_subcommands() {
    "$1" --help 2>/dev/null | awk '/^Subcommands:/ { on = 1; next } on && /^  [a-z]/ { print $1 } on && /^$/ { on = 0 }'
}

declare -gA _heapsnap_cache 2>/dev/null || true

# The option table of a subcommand, cached per binary.
_heapsnap_options_of() {
    local key="$1|$2"
    if [[ -z ${_heapsnap_cache[$key]+set} ]]; then
        _heapsnap_cache[$key]=$(_heapsnap_option_table "$1" "$2")
    fi
    printf '%s\n' "${_heapsnap_cache[$key]}"
}

# Markers of a log: indices, labels, and the moments every log has.
_heapsnap_markers_of() {
    local bin=$1 log=$2
    [[ -f $log ]] || return
    {
        printf '%s\n' exit peak end
        "$bin" markers "$log" --format json 2>/dev/null |
            sed -n -e 's/^ *"index": \([0-9]*\),$/\1/p' -e 's/^ *"label": "\(.*\)",$/\1/p'
    } | awk '!seen[$0]++'
}

# Files and directories: those ending in one of the suffixes $3 (an
# extended regular expression, default logs and snapshots) when there are
# any, else all.
_heapsnap_files() {
    local cur=$1 log_suffix=$2 suffixes=${3:-hsnap|hslog} f
    local -a files
    mapfile -t files < <(compgen -f -- "$cur" | grep -E "\\.($suffixes)\$")
    if ((${#files[@]} == 0)); then
        compgen -f -- "$cur"
        return
    fi
    for f in "${files[@]}"; do
        [[ $f == *.hslog ]] && f+=$log_suffix
        printf '%s\n' "$f"
    done
    compgen -d -S / -- "$cur"
}

# The row of option $3 in the table of `heapsnap $2`.
_heapsnap_option_row() {
    _heapsnap_options_of "$1" "$2" | awk -v name="$3" '$1 == name { print; exit }'
}

# Words for a moment argument: files, and LOG@MARKER once the word has an @.
# $4: what follows a log's name ("@" where a log needs a marker).
_heapsnap_moment_words() {
    local bin=$1 cur=$2 every=$3 log_suffix=$4 log marker m
    if [[ $cur == *@* ]]; then
        log=${cur%@*}
        marker=${cur##*@}
        if [[ -f $log ]]; then
            {
                _heapsnap_markers_of "$bin" "$log"
                [[ $every == 1 ]] && echo '*'
            } | while IFS= read -r m; do
                [[ $m == "$marker"* ]] && printf '%s@%s\n' "$log" "$m"
            done
            return
        fi
    fi
    _heapsnap_files "$cur" "$log_suffix"
}

_heapsnap_pids() {
    [[ $1 =~ ^[0-9]*$ ]] || return
    ps -o pid= -u "$(id -u)" 2>/dev/null | tr -d ' ' | awk -v c="$1" 'index($0, c) == 1'
}

_heapsnap() {
    local bin=${COMP_WORDS[0]} cur=${COMP_WORDS[COMP_CWORD]} prev=""
    ((COMP_CWORD > 0)) && prev=${COMP_WORDS[COMP_CWORD - 1]}
    local -a reply=()
    local sub="" i word dashdash=0 first_arg=""

    # The subcommand, whether `--` came before the word, and the first
    # positional argument after the subcommand (the log of `snapshot`).
    for ((i = 1; i < COMP_CWORD; i++)); do
        word=${COMP_WORDS[i]}
        if [[ -z $sub ]]; then
            [[ $word != -* ]] && sub=$word
        elif [[ $word == -- ]]; then
            dashdash=$i
            break
        elif [[ $word != -* && -z $first_arg ]]; then
            local before=${COMP_WORDS[i - 1]}
            if [[ $before != -* || $(_heapsnap_option_row "$bin" "$sub" "$before") != *" 1 "* ]]; then
                first_arg=$word
            fi
        fi
    done

    if [[ -z $sub ]]; then
        if [[ $cur == -* ]]; then
            mapfile -t reply < <(compgen -W "$(_heapsnap_options_of "$bin" "" | cut -d' ' -f1)" -- "$cur")
        else
            mapfile -t reply < <(compgen -W "$(_heapsnap_subcommands "$bin")" -- "$cur")
        fi
        COMPREPLY=("${reply[@]}")
        return
    fi

    # `heapsnap run [options] -- PROGRAM ARGS...`
    if [[ $sub == run && $dashdash -gt 0 ]]; then
        if ((COMP_CWORD == dashdash + 1)); then
            mapfile -t reply < <(compgen -c -- "$cur" | awk '!seen[$0]++')
        else
            mapfile -t reply < <(compgen -f -- "$cur")
        fi
        COMPREPLY=("${reply[@]}")
        return
    fi

    # The value of an option.
    local row
    [[ $prev == -* ]] && row=$(_heapsnap_option_row "$bin" "$sub" "$prev")
    if [[ $row == *" 1 "* ]]; then
        local choices
        choices=$(cut -d' ' -f3 <<<"$row")
        if [[ $choices != - ]]; then
            mapfile -t reply < <(compgen -W "${choices//,/ }" -- "$cur")
        elif [[ $prev == --at ]]; then
            mapfile -t reply < <(_heapsnap_markers_of "$bin" "$first_arg" | awk -v c="$cur" 'index($0, c) == 1')
        elif [[ $prev == -o || $prev == --output ]]; then
            mapfile -t reply < <(compgen -f -- "$cur")
        elif [[ $prev == --snapshot-when ]]; then
            mapfile -t reply < <(compgen -W "\'rss> \'live> \'growth>" -- "$cur")
            compopt -o nospace 2>/dev/null
        fi
        COMPREPLY=("${reply[@]}")
        return
    fi

    if [[ $cur == -* ]]; then
        mapfile -t reply < <(compgen -W "$(_heapsnap_options_of "$bin" "$sub" | cut -d' ' -f1) --" -- "$cur")
        [[ $sub != run ]] && mapfile -t reply < <(printf '%s\n' "${reply[@]}" | grep -vx -- '--')
        COMPREPLY=("${reply[@]}")
        return
    fi

    case $sub in
        run)
            mapfile -t reply < <(compgen -W "--" -- "$cur")
            ;;
        snapshot)
            mapfile -t reply < <({
                _heapsnap_pids "$cur"
                _heapsnap_files "$cur" "" hslog
            })
            ;;
        diff)
            mapfile -t reply < <(_heapsnap_moment_words "$bin" "$cur" 1 @)
            ;;
        report)
            mapfile -t reply < <(_heapsnap_moment_words "$bin" "$cur" 0 "")
            ;;
        maps)
            mapfile -t reply < <({
                _heapsnap_pids "$cur"
                _heapsnap_moment_words "$bin" "$cur" 0 @
            })
            ;;
        markers | dump)
            mapfile -t reply < <(_heapsnap_files "$cur" "" hslog)
            ;;
        attach | detach | pause | resume)
            mapfile -t reply < <(_heapsnap_pids "$cur")
            ;;
        ps) ;;
        *)
            mapfile -t reply < <(compgen -f -- "$cur")
            ;;
    esac
    COMPREPLY=("${reply[@]}")
    # A directory or a LOG@ prefix continues without a space.
    if [[ ${#COMPREPLY[@]} -eq 1 && (${COMPREPLY[0]} == */ || ${COMPREPLY[0]} == *@) ]]; then
        compopt -o nospace 2>/dev/null
    fi
}

complete -F _heapsnap heapsnap
