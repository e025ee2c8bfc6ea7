from oomguard.cli import main

raise SystemExit(main())
