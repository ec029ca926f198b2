umask 077
exec 9<&0 </dev/null
QINGLONG_D=$1
QINGLONG_L=$2
QINGLONG_G=$3
QINGLONG_O=$4
printf '%s\n' "$$" >"$QINGLONG_D/pid" || exit 70
trap : TERM INT HUP
QINGLONG_W=
if [ -f "$QINGLONG_D/fence" ]; then
  {
    trap '' TERM INT HUP
    QINGLONG_P=
    trap 'kill -KILL $QINGLONG_P 2>/dev/null; exit 0' USR1
    while :; do
      QINGLONG_F=
      IFS= read -r QINGLONG_F <"$QINGLONG_D/fence"
      IFS=' ' read -r QINGLONG_U QINGLONG_V </proc/uptime
      QINGLONG_U=${QINGLONG_U%.*}${QINGLONG_U#*.}
      case $QINGLONG_F in '' | *[!0-9]*) QINGLONG_F=0 ;; esac
      case $QINGLONG_U in '' | *[!0-9]*) QINGLONG_U=$QINGLONG_F ;; esac
      [ "$QINGLONG_U" -lt "$QINGLONG_F" ] || kill -KILL 0
      @SLEEP@ 1 &
      QINGLONG_P=$!
      wait "$QINGLONG_P"
      QINGLONG_P=
    done
  } </dev/null >/dev/null 2>&1 9<&- &
  QINGLONG_W=$!
fi
{
  trap '' TERM INT HUP
  QINGLONG_K=0
  QINGLONG_E=
  if true >>"$QINGLONG_D/log"; then
    if [ -s "$QINGLONG_D/log" ]; then
      QINGLONG_N=$(@WC@ -c <"$QINGLONG_D/log") && QINGLONG_K=$((QINGLONG_L - $QINGLONG_N))
    else
      QINGLONG_K=$QINGLONG_L
    fi
  fi
  while [ "$QINGLONG_K" -gt 0 ]; do
    QINGLONG_B=$((QINGLONG_K / 1024))
    if [ "$QINGLONG_B" -gt 4096 ]; then QINGLONG_B=4096; elif [ "$QINGLONG_B" -lt 1 ]; then QINGLONG_B=1; fi
    QINGLONG_C=$((QINGLONG_K / QINGLONG_B))
    LC_ALL=C @DD@ bs="$QINGLONG_B" count="$QINGLONG_C" >>"$QINGLONG_D/log" 2>"$QINGLONG_D/copied" || break
    QINGLONG_X=
    while IFS= read -r QINGLONG_N; do
      case $QINGLONG_N in *" records in") QINGLONG_X=${QINGLONG_N%% *} ;; esac
    done <"$QINGLONG_D/copied"
    case $QINGLONG_X in
      *[!0-9+]* | *+*+*) ;;
      [0-9]*+[0-9]*) if [ $((${QINGLONG_X%+*} + ${QINGLONG_X#*+})) -lt "$QINGLONG_C" ]; then QINGLONG_E=1; break; fi ;;
    esac
    QINGLONG_N=$(@WC@ -c <"$QINGLONG_D/log") || break
    QINGLONG_N=$((QINGLONG_L - $QINGLONG_N))
    [ "$QINGLONG_N" -lt "$QINGLONG_K" ] || break
    QINGLONG_K=$QINGLONG_N
  done
  if [ -n "$QINGLONG_E" ]; then printf '0\n' >"$QINGLONG_D/dropped"; exit 0; fi
  exec @WC@ -c >"$QINGLONG_D/dropped"
} <"$QINGLONG_D/out" 9<&- &
QINGLONG_R=$!
qinglong_reading() {
  QINGLONG_Y=
  { IFS=' ' read -r QINGLONG_N QINGLONG_N QINGLONG_Y QINGLONG_N <"/proc/$QINGLONG_R/stat"; } 2>/dev/null
  [ -n "$QINGLONG_Y" ] && [ "$QINGLONG_Y" != Z ]
}
qinglong_drain() {
  QINGLONG_T=0
  QINGLONG_Q=5
  QINGLONG_I=0
  while [ "$QINGLONG_I" -lt 200 ] && qinglong_reading; do QINGLONG_I=$((QINGLONG_I + 1)); done
  while qinglong_reading; do
    [ "$QINGLONG_T" -lt "$QINGLONG_G" ] || return 1
    case $QINGLONG_Q in ?) QINGLONG_Z=0.00$QINGLONG_Q ;; ??) QINGLONG_Z=0.0$QINGLONG_Q ;; *) QINGLONG_Z=0.$QINGLONG_Q ;; esac
    @SLEEP@ "$QINGLONG_Z"
    QINGLONG_T=$((QINGLONG_T + QINGLONG_Q))
    QINGLONG_Q=$((QINGLONG_Q * 2))
    [ "$QINGLONG_Q" -le 200 ] || QINGLONG_Q=200
  done
}
shift 5
"$@" >"$QINGLONG_D/out" 2>&1 9<&-
QINGLONG_S=$?
printf '%s\n' "$QINGLONG_S" >"$QINGLONG_D/exited"
QINGLONG_H=
if ! qinglong_drain; then
  if [ "$QINGLONG_O" = kill ]; then
    kill -TERM 0 2>/dev/null
    if qinglong_drain; then QINGLONG_H=term; else QINGLONG_H=killed; fi
  else
    QINGLONG_H=left
  fi
fi
if [ -z "$QINGLONG_H" ] || [ "$QINGLONG_H" = term ]; then
  wait "$QINGLONG_R"
  while [ "$?" -gt 128 ] && kill -0 "$QINGLONG_R" 2>/dev/null; do wait "$QINGLONG_R"; done
fi
if [ -n "$QINGLONG_W" ]; then
  kill -USR1 "$QINGLONG_W" 2>/dev/null
  wait "$QINGLONG_W"
  while [ "$?" -gt 128 ] && kill -0 "$QINGLONG_W" 2>/dev/null; do wait "$QINGLONG_W"; done
fi
QINGLONG_N=
case $QINGLONG_H in '' | term) IFS= read -r QINGLONG_N <"$QINGLONG_D/dropped" ;; esac
printf 'format=2\nstatus=%s\ndropped=%s\nheld=%s\nend\n' "$QINGLONG_S" "$QINGLONG_N" "$QINGLONG_H" >"$QINGLONG_D/receipt"
[ "$QINGLONG_H" != killed ] || kill -KILL 0
