from hypothesis import settings
from tests.test_scheduler_properties import OpenStreams
T = OpenStreams.TestCase
T.settings = settings(max_examples=1500, stateful_step_count=50, deadline=None)
