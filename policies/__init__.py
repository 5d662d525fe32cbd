"""The policy: readings in, assessments and decisions out; no I/O.

Importing the package first looks for a compiled build of its hot modules made
from exactly these sources (:mod:`policies.native`), and otherwise runs them as
they are.
"""

from policies import native as native
