# The distributed sampler (common/sampler.h): unit tests.
source "$(dirname "$0")/../lib.sh"
"$ROOT/tests/unit/test_sampler"
