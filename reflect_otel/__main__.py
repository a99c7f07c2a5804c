from reflect_otel.cli import main

raise SystemExit(main())
