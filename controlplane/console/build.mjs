// Copies the front-end libraries the console serves from node_modules (npm ci) into
// static/vendor, which the control plane serves under /console/static/vendor. No bundler:
// the console's own modules are served as written.
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const vendor = join(here, "static", "vendor");
const files = {
  "uplot/dist/uPlot.iife.min.js": "uPlot.iife.min.js",
  "uplot/dist/uPlot.min.css": "uPlot.min.css",
  "swagger-ui-dist/swagger-ui-bundle.js": "swagger-ui-bundle.js",
  "swagger-ui-dist/swagger-ui.css": "swagger-ui.css",
};
rmSync(vendor, { recursive: true, force: true });
mkdirSync(vendor, { recursive: true });
for (const [from, to] of Object.entries(files)) copyFileSync(join(here, "node_modules", from), join(vendor, to));
console.log(`console assets: ${Object.keys(files).length} files in ${vendor}`);
