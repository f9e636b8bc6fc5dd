#!/bin/bash
# Environment settings on the command line (docs/settings.md): `info --settings` shows the
# values in force and marks bad ones; any other command refuses a bad value at once, naming
# the variable. usage: cli_settings.sh RINGTRAIN SOURCE_DIR
bin=$1 src=$2
# shellcheck source=../cli_expect.sh
. "$src/tests/cli_expect.sh"
unset RINGTRAIN_DIST_TIMEOUT RINGTRAIN_SHM_SPIN_US TORCH_DISTRIBUTED_DEBUG RINGTRAIN_LOG_LEVEL

expect 0 '^RINGTRAIN_DIST_TIMEOUT=300 \(default\)' info --settings
expect 0 '^    float 0.001..100000000: ' info --settings
expect 0 '^RINGTRAIN_TEST_NAN_AT=' info --settings # test hooks are listed too
export RINGTRAIN_DIST_TIMEOUT=7
expect 0 '^RINGTRAIN_DIST_TIMEOUT=7 \(environment\)' info --settings
expect 0 '"name": "RINGTRAIN_DIST_TIMEOUT", .*"value": "7", "source": "environment"' info --settings --json
export RINGTRAIN_DIST_TIMEOUT=abc
expect 0 "^RINGTRAIN_DIST_TIMEOUT=abc \(environment; INVALID: RINGTRAIN_DIST_TIMEOUT='abc': expected a number" \
  info --settings
# every other command refuses it before doing anything (exit 2), naming the variable
expect 2 "ringtrain: error: RINGTRAIN_DIST_TIMEOUT='abc': expected a number in 0.001..100000000" \
  train "$src/configs/quickstart.yaml"
expect 2 "RINGTRAIN_DIST_TIMEOUT='abc'" eval "$src/configs/quickstart.yaml"
expect 2 "RINGTRAIN_DIST_TIMEOUT='abc'" bench comm --nproc 2
export RINGTRAIN_DIST_TIMEOUT=0 # out of range (atof's 0 was ignored before)
expect 2 "RINGTRAIN_DIST_TIMEOUT='0'" train "$src/configs/quickstart.yaml"
unset RINGTRAIN_DIST_TIMEOUT
export TORCH_DISTRIBUTED_DEBUG=VERBOSE
expect 2 "TORCH_DISTRIBUTED_DEBUG='VERBOSE': expected one of OFF\|INFO\|DETAIL" train "$src/configs/quickstart.yaml"
unset TORCH_DISTRIBUTED_DEBUG
export RINGTRAIN_SHM_SPIN_US=20us
expect 2 "RINGTRAIN_SHM_SPIN_US='20us': expected an integer in 0..1000000" data --help
unset RINGTRAIN_SHM_SPIN_US
# usage errors
expect 2 "--markdown goes with --settings" info --markdown
expect 2 "unknown option '--bogus'" info --settings --bogus
expect_done
