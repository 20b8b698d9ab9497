import sys

from experiments.expert.recipe import main

sys.exit(main())
