import sys

from privdl.cli.main import main

sys.exit(main())
